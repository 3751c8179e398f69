/*
 * `_exit` called from a signal handler while the
 * interrupted thread is inside malloc. Leaks one 4096-byte block, then has
 * SIGALRM fire every millisecond while the main thread mallocs and frees
 * in a loop; the handler's first run calls _exit(7). Writing the report
 * inside the handler took glibc's malloc lock that the interrupted malloc
 * held: the process hung.
 */
#include "common.h"

#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t fired;

static void on_alarm(int sig) {
    (void)sig;
    if (!fired) {
        fired = 1;
        _exit(7);
    }
}

void leak_before_exit(void) { void *p; CHECK(cudaMalloc(&p, 4096)); /* LEAK in handler test */ }

int main(void) {
    leak_before_exit();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval t = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &t, NULL);
    for (unsigned long i = 0;; i++) {
        void *volatile q = malloc(64 + (i % 4096));
        free(q);
    }
}
