/* Listen addresses as both daemons and the gateway's config read them: "HOST:PORT",
 * "[V6]:PORT", ":PORT", "*:PORT" or "PORT" (all IPv4 addresses), "localhost:PORT". Host
 * names are never looked up, so an address that parses here is one the listener can
 * bind to without DNS. */
#ifndef PR_ADDR_H
#define PR_ADDR_H

#include <sys/socket.h>

/* Parse addr into ss. Returns 0, or -EINVAL with *why (when why is not NULL) set to a
 * static phrase that says what is wrong, for messages such as config errors. */
int pr_addr_parse(const char *addr, struct sockaddr_storage *ss, const char **why);

#endif
