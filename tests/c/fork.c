/*
 * fork: "before" forks before any CUDA use, and parent and child each leak
 * their own block; "after" leaks in the parent, then forks a child that
 * makes no CUDA call (and so writes no report); "exec" forks a child that
 * execs another planted-leak program.
 */
#include "common.h"

#include <sys/wait.h>
#include <unistd.h>

void child_leak(void) { void *p; CHECK(cudaMalloc(&p, 111)); /* LEAK child */ }
void parent_leak(void) { void *p; CHECK(cudaMalloc(&p, 222)); /* LEAK parent */ }

static void wait_child(pid_t pid) {
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "child failed: %d\n", st);
        exit(6);
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "before";
    if (!strcmp(mode, "before")) {
        pid_t pid = fork();
        if (pid == 0) {
            void *q;
            child_leak();
            CHECK(cudaMalloc(&q, 50));
            CHECK(cudaFree(q));
            exit(0);
        }
        wait_child(pid);
        parent_leak();
    } else if (!strcmp(mode, "after")) {
        parent_leak();
        pid_t pid = fork();
        if (pid == 0) exit(0);
        wait_child(pid);
    } else if (!strcmp(mode, "exec")) {
        parent_leak();
        pid_t pid = fork();
        if (pid == 0) {
            execv(argv[2], (char *[]){argv[2], NULL});
            _exit(7);
        }
        wait_child(pid);
    }
    return 0;
}
