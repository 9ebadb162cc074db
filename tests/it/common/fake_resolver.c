/* A name the test controls, for a process started with LD_PRELOAD of this file compiled as a
 * shared object (tests/it/common/fake_resolver.rs builds it with `cc`): getaddrinfo of the name
 * in FAKE_RESOLVE_NAME answers the IPv4 addresses listed in the file FAKE_RESOLVE_FILE (read at
 * every call, whitespace-separated), so a test changes what the name resolves to by rewriting
 * the file; every other name goes to the real getaddrinfo. Each answer is allocated as glibc
 * allocates its own (the sockaddr in the same block, no canonical name), so glibc's
 * freeaddrinfo frees it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*getaddrinfo_fn)(const char *, const char *, const struct addrinfo *,
                              struct addrinfo **);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res) {
    static getaddrinfo_fn real;
    if (!real) real = (getaddrinfo_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    const char *name = getenv("FAKE_RESOLVE_NAME");
    const char *path = getenv("FAKE_RESOLVE_FILE");
    if (!node || !name || !path || strcmp(node, name) != 0) return real(node, service, hints, res);
    FILE *f = fopen(path, "r");
    if (!f) return EAI_NONAME;
    unsigned short port = service ? (unsigned short)atoi(service) : 0;
    struct addrinfo *head = NULL, **tail = &head;
    char text[64];
    while (fscanf(f, "%63s", text) == 1) {
        struct in_addr ip;
        if (inet_pton(AF_INET, text, &ip) != 1) continue;
        struct addrinfo *ai = calloc(1, sizeof(struct addrinfo) + sizeof(struct sockaddr_in));
        if (!ai) break;
        struct sockaddr_in *sin = (struct sockaddr_in *)(ai + 1);
        sin->sin_family = AF_INET;
        sin->sin_port = htons(port);
        sin->sin_addr = ip;
        ai->ai_family = AF_INET;
        ai->ai_socktype = hints && hints->ai_socktype ? hints->ai_socktype : SOCK_STREAM;
        ai->ai_protocol = IPPROTO_TCP;
        ai->ai_addrlen = sizeof(struct sockaddr_in);
        ai->ai_addr = (struct sockaddr *)sin;
        *tail = ai;
        tail = &ai->ai_next;
    }
    fclose(f);
    if (!head) return EAI_NONAME;
    *res = head;
    return 0;
}
