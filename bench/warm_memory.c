/*
 * warm_memory MB: writes MB mebibytes of fresh anonymous memory in 2 MiB
 * pages, then exits and gives it back.
 *
 * bench/run.sh runs it before every timed run of every runtime. On a VM
 * whose balloon reports free memory to the host (virtio-balloon free page
 * reporting, as on the machine the README names), memory a process frees
 * is handed back to the host after about two seconds, and the next first
 * touch of it waits for the host to back it again: measured here 200-330
 * ns per 120 bytes against 24-30 once backed. Which runs paid that then
 * depended on what ran in the seconds before. After this step each run
 * starts with the same free memory, backed, as on a machine with no host.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* MADV_HUGEPAGE */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv)
{
    long mb = argc > 1 ? atol(argv[1]) : 256;
    size_t size;
    char *p;

    if (mb <= 0 || mb > (1L << 20)) {
        fprintf(stderr, "usage: warm_memory MB (1..%ld)\n", 1L << 20);
        return 2;
    }
    size = (size_t)mb << 20;
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("warm_memory: mmap");
        return 1;
    }
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE); /* whole 2 MiB blocks, as the table maps them */
#endif
    memset(p, 1, size);
    return munmap(p, size) != 0;
}
