/* The status page: one HTML file with its CSS and JavaScript (gateway/status/index.html),
 * compiled into the binary by gateway/status/embed.py, served at / on the admin
 * listener. It loads nothing from elsewhere, which the Content-Security-Policy holds it
 * to; it reads the admin API with the token the user gives it. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "admin.h"

extern const unsigned char gw_status_page[];
extern const size_t gw_status_page_len;
extern const char gw_status_page_etag[];

void gw_statuspage_serve(pr_http_req *req) {
  char etag[96];
  snprintf(etag, sizeof(etag), "ETag: %s", gw_status_page_etag);
  const char *hdrs[] = {
      etag,
      "Cache-Control: no-cache",
      "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "
      "style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; "
      "form-action 'none'; frame-ancestors 'none'",
      "X-Content-Type-Options: nosniff",
      "Referrer-Policy: no-referrer",
      "X-Frame-Options: DENY",
      NULL};
  const char *inm = pr_http_header_get(req, "if-none-match");
  if (inm && strstr(inm, gw_status_page_etag)) {
    pr_http_respond(req, 304, hdrs, NULL, NULL, 0);
    return;
  }
  pr_http_respond(req, 200, hdrs, "text/html; charset=utf-8", (const char *)gw_status_page,
                  gw_status_page_len);
}
