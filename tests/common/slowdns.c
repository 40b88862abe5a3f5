/* For tests/guard.rs: LD_PRELOADed into a chronos node, it makes
   getaddrinfo behave like a resolver whose server does not answer for
   names starting "slow" (5 s, then EAI_AGAIN); other names resolve as
   usual. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <string.h>
#include <unistd.h>
/* getaddrinfo as a resolver whose server does not answer, for names
   starting "slow": 5 s, then "no such name". */
int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res) {
    static int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
    if (!real) real = dlsym(RTLD_NEXT, "getaddrinfo");
    if (node && strncmp(node, "slow", 4) == 0) { sleep(5); return EAI_AGAIN; }
    return real(node, service, hints, res);
}
