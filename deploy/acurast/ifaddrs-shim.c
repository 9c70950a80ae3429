/* libfgifaddrs.so: getifaddrs() for programs run under PRoot on an Android phone.
 *
 * Inside Acurast's Shell runtime a program's getifaddrs() asks the Android kernel for its
 * network interfaces over netlink, which Android refuses to apps (or answers with
 * interfaces the sandbox cannot use); llama-server then fails to start. Loaded with
 * LD_PRELOAD (deploy/acurast/run.sh does so for llama-server), this library answers
 * getifaddrs() with the one interface such a program may use: loopback, 127.0.0.1/8 and
 * ::1/128, up. The agent itself is a static program and does not call it.
 *
 * Built by deploy/acurast/make-deployment.sh with the phone's compiler
 * (aarch64-linux-gnu-gcc -shared -fPIC); it uses only calloc and free, so it loads into
 * any glibc userland from 2.17 on. */
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* One interface entry and everything it points to, in one allocation: freeifaddrs frees
 * each entry of the list with one free(). */
typedef struct shim_if {
  struct ifaddrs ifa;
  union {
    struct sockaddr_in v4;
    struct sockaddr_in6 v6;
  } addr, mask;
  char name[IFNAMSIZ];
} shim_if;

static shim_if *entry(int family) {
  shim_if *e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  strcpy(e->name, "lo");
  e->ifa.ifa_name = e->name;
  e->ifa.ifa_flags = IFF_UP | IFF_RUNNING | IFF_LOOPBACK;
  if (family == AF_INET) {
    e->addr.v4.sin_family = e->mask.v4.sin_family = AF_INET;
    e->addr.v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    e->mask.v4.sin_addr.s_addr = htonl(0xff000000u);
  } else {
    e->addr.v6.sin6_family = e->mask.v6.sin6_family = AF_INET6;
    e->addr.v6.sin6_addr = (struct in6_addr)IN6ADDR_LOOPBACK_INIT;
    memset(&e->mask.v6.sin6_addr, 0xff, sizeof(e->mask.v6.sin6_addr));
  }
  e->ifa.ifa_addr = (struct sockaddr *)&e->addr;
  e->ifa.ifa_netmask = (struct sockaddr *)&e->mask;
  return e;
}

int getifaddrs(struct ifaddrs **ifap) {
  shim_if *v4 = entry(AF_INET), *v6 = entry(AF_INET6);
  if (!v4 || !v6) {
    free(v4);
    free(v6);
    *ifap = NULL;
    return -1; /* calloc set errno to ENOMEM */
  }
  v4->ifa.ifa_next = &v6->ifa;
  *ifap = &v4->ifa;
  return 0;
}

void freeifaddrs(struct ifaddrs *ifa) {
  while (ifa) {
    struct ifaddrs *next = ifa->ifa_next;
    free(ifa); /* ifa is the first member of its shim_if */
    ifa = next;
  }
}
