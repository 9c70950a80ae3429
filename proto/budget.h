/* A byte budget shared by many holders (the request bodies all connections of a process
 * buffer): take before holding, give back when done. Pure bookkeeping, no I/O, so the
 * accounting is unit-tested on its own (tests/unit/test_budget.c). */
#ifndef PR_BUDGET_H
#define PR_BUDGET_H

#include <stddef.h>

typedef struct pr_budget {
  size_t max;  /* 0: no limit (used is still counted) */
  size_t used;
} pr_budget;

/* Take n bytes: 0, or PR_EBUSY (nothing taken) when used + n would pass max. */
int pr_budget_take(pr_budget *b, size_t n);
/* Give n bytes back (never below 0). */
void pr_budget_give(pr_budget *b, size_t n);

#endif
