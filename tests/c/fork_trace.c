/*
 * fork_trace: the parent leaks 222 bytes, then forks; the child leaks 111
 * bytes of its own and exits. Under CUDALEAK_TRACE the child's
 * allocation_trace holds the child's event only.
 */
#include "common.h"

#include <sys/wait.h>
#include <unistd.h>

void child_leak(void) { void *p; CHECK(cudaMalloc(&p, 111)); /* LEAK child */ }
void parent_leak(void) { void *p; CHECK(cudaMalloc(&p, 222)); /* LEAK parent */ }

int main(void) {
    parent_leak();
    pid_t pid = fork();
    if (pid == 0) {
        child_leak();
        exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 6;
}
