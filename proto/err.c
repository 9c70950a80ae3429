/* Names and messages for the error codes in err.h. */
#include "err.h"

#include <string.h>

static const struct {
  int code;
  const char *name;
  const char *msg;
} pr_err_table[] = {
  {PR_ETOOLARGE, "ETOOLARGE", "too large"},
  {PR_EPARSE, "EPARSE", "malformed input"},
  {PR_ETYPE, "ETYPE", "wrong type"},
  {PR_EMISSING, "EMISSING", "missing value"},
  {PR_ERANGE, "ERANGE", "value out of range"},
  {PR_ECLOSED, "ECLOSED", "closed"},
  {PR_ECURL, "ECURL", "upstream transfer error"},
  {PR_ETLS, "ETLS", "TLS error"},
  {PR_EUNKNOWN, "EUNKNOWN", "unknown"},
  {PR_EBUSY, "EBUSY", "no capacity"},
  {-ENOMEM, "ENOMEM", "out of memory"},
  {-EINVAL, "EINVAL", "invalid argument"},
  {-ENOENT, "ENOENT", "no such file or directory"},
  {-EACCES, "EACCES", "permission denied"},
  {-EEXIST, "EEXIST", "already exists"},
  {-ETIMEDOUT, "ETIMEDOUT", "timed out"},
  {-ECONNREFUSED, "ECONNREFUSED", "connection refused"},
  {-ECONNRESET, "ECONNRESET", "connection reset"},
  {-EADDRINUSE, "EADDRINUSE", "address in use"},
  {-EPIPE, "EPIPE", "broken pipe"},
  {-ECANCELED, "ECANCELED", "canceled"},
  {-EAGAIN, "EAGAIN", "try again"},
  {-EPROTO, "EPROTO", "protocol error"},
};

const char *pr_errname(int code) {
  for (size_t i = 0; i < sizeof(pr_err_table) / sizeof(pr_err_table[0]); i++)
    if (pr_err_table[i].code == code) return pr_err_table[i].name;
  return code == 0 ? "OK" : "EOTHER";
}

const char *pr_strerror(int code) {
  for (size_t i = 0; i < sizeof(pr_err_table) / sizeof(pr_err_table[0]); i++)
    if (pr_err_table[i].code == code) return pr_err_table[i].msg;
  if (code == 0) return "success";
  if (code < 0 && code > -4000) return strerror(-code);
  return "unknown error";
}
