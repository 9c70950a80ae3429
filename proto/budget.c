/* Byte budgets; see budget.h. */
#include "budget.h"

#include "err.h"

int pr_budget_take(pr_budget *b, size_t n) {
  /* written so that a huge n cannot wrap around */
  if (b->max && (b->used > b->max || n > b->max - b->used)) return PR_EBUSY;
  b->used += n;
  return 0;
}

void pr_budget_give(pr_budget *b, size_t n) { b->used = n > b->used ? 0 : b->used - n; }
