/*
 * The ways a process ends, against the moments it can end in
 * (tests/endings.rs). The process first plants one leak: 1 MiB from
 * plant_leak() (the line marked LEAK planted), which its final report must
 * hold exactly, whatever the way out; the ways whose leak is made
 * elsewhere (exec_*, daemon, linger, clean) allocate and free one block
 * instead.
 *
 *   endings WAY MOMENT [THREADS [BLOCKS [DELAY_MS]]]
 *
 * MOMENT, what the process is doing when it ends:
 *   idle  nothing: no CUDA call in flight.
 *   hook  THREADS threads loop on cudaMalloc/cudaFree (4096 bytes, from
 *         churn()); with THREADS 0 the main thread itself does: the
 *         process ends inside a hook. With SIMCUDA_ALLOC_SLEEP_US (the
 *         test sets it in half the runs) each allocation sleeps inside the
 *         driver, and the end comes in the real call; without it the loop
 *         is tight, and the end comes in the hook's own work.
 *   dump  BLOCKS live blocks of 64 bytes, each from its own call stack
 *         (kept: they are leaks too), then SIGUSR1 to itself (only under
 *         the library: without it the signal would end the program): the
 *         way out comes DELAY_MS later, while the live dump runs.
 *   oom   BLOCKS live blocks of 64 bytes from hold() (kept), then THREADS
 *         threads (at least 1) loop on cudaMalloc requests of 2 GiB, which
 *         fail (the test sets SIMCUDA_MAX_ALLOC to 1 GiB): each failure
 *         takes an out-of-memory snapshot of the live map in its hook.
 *
 * Then it prints "ready" (tests/python/endings_agent.py, which starts it,
 * sends its signals after that line) and, DELAY_MS (default 100) later,
 * goes out by WAY:
 *   return     main returns 0 (other threads still running).
 *   exit       exit(0).
 *   _exit      _exit(0).
 *   fail       exit(1): a torchrun worker that fails.
 *   alarm      _exit(0) in a SIGALRM handler: the timer fires DELAY_MS
 *              after "ready", on whichever thread it interrupts (with
 *              `hook` and THREADS 0, the main thread inside a hook).
 *   term_exit  exit(0) in a SIGTERM handler, as training scripts do to
 *              checkpoint and stop; waits for the signal.
 *   wait       waits for a signal with every disposition at its default
 *              (the agent sends SIGTERM, SIGINT, SIGKILL or SIGSEGV).
 *   abort      abort().
 *   segv       a write through a null pointer.
 *   exec       execv of this program as `endings clean idle`: the new
 *              image allocates and frees one block, and leaks nothing.
 *   exec_exit, exec_kill, exec_segv, exec_abort
 *              no leak before: execv("/nonexistent/...") fails (its exec
 *              report holds no leak); 5 MiB leak from plant_after_exec()
 *              (LEAK after exec); then exit(0), SIGKILL to itself, a null
 *              write, or abort().
 *   cancel     with `idle`: a thread whose cancellation is already pending
 *              makes the process's first allocation call (the planted
 *              leak), then reaches pthread_testcancel(); main joins it and
 *              returns 0. With `hook`: THREADS (at least 1) threads churn
 *              and main cancels them: the cancellation acts at the
 *              driver's sleep, a cancellation point inside the real call
 *              (so does every allocation with SIMCUDA_ALLOC_TESTCANCEL=1).
 *   fork       a forked child leaks 2 MiB from plant_in_child() (LEAK in
 *              child) and exits 0; main waits for it and returns 0.
 *   daemon     no leak in main: a double-forked grandchild (its own
 *              session, standard descriptors on /dev/null) leaks 2 MiB from
 *              plant_in_daemon() (LEAK in daemon) 0.5 s after main
 *              returned 0, then exits 0.
 *   linger     no planted leak (one block allocated and freed): a
 *              double-forked grandchild that never calls CUDA sleeps 60 s
 *              (a compiler cache server, say); main prints "linger PID"
 *              and returns 0.
 *   nested     a SIGALRM handler, every millisecond, calls cudaMalloc
 *              (8 KiB from alloc_in_handler(), LEAK in handler) while the
 *              main thread loops on cudaMalloc/cudaFree through the
 *              runtime, so that the handler's call often comes while a
 *              hook is capturing the main thread's stack; after BLOCKS
 *              (default 200) such calls main exits with status 9. Run with
 *              SIMCUDA_SIGNAL_SAFE=1: the simulated driver itself is then
 *              safe to enter from the handler.
 *   clean      no planted leak: one block allocated and freed, return 0.
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024 * 1024)

void plant_leak(void) { void *p; CHECK(cudaMalloc(&p, MIB)); /* LEAK planted */ }
void plant_after_exec(void) { void *p; CHECK(cudaMalloc(&p, 5 * MIB)); /* LEAK after exec */ }
void plant_in_child(void) { void *p; CHECK(cudaMalloc(&p, 2 * MIB)); /* LEAK in child */ }
void plant_in_daemon(void) { void *p; CHECK(cudaMalloc(&p, 2 * MIB)); /* LEAK in daemon */ }
void alloc_in_handler(void) { void *p; CHECK(cudaMalloc(&p, 8192)); /* LEAK in handler */ }

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

/* ---- hook: allocation and free in a loop ---- */

void churn(void) {
    void *p;
    CHECK(cudaMalloc(&p, 4096));
    CHECK(cudaFree(p));
}

static void *churn_forever(void *arg) {
    (void)arg;
    for (;;) churn();
    return NULL;
}

/* ---- dump: distinct stacks, as in reliability.c's `stacks` ---- */

void __attribute__((noinline)) distinct_leaf(void) {
    void *p;
    CHECK(cudaMalloc(&p, 64));
}
static void __attribute__((noinline)) branch(unsigned path, int depth);
static void __attribute__((noinline)) branch_a(unsigned path, int depth) { branch(path >> 1, depth - 1); }
static void __attribute__((noinline)) branch_b(unsigned path, int depth) { branch(path >> 1, depth - 1); }
static void __attribute__((noinline)) branch(unsigned path, int depth) {
    if (depth == 0) {
        distinct_leaf();
    } else if (path & 1) {
        branch_a(path, depth);
    } else {
        branch_b(path, depth);
    }
    __asm__ volatile("" ::: "memory"); /* no tail calls: every frame stays */
}
static void leak_distinct_stacks(long n) {
    int bits = 0;
    while ((1L << bits) < n) bits++;
    for (long path = 0; path < n; path++) branch((unsigned)path, bits);
}

/* ---- oom ---- */

void hold(void) {
    void *p;
    CHECK(cudaMalloc(&p, 64));
}

static void *fail_forever(void *arg) {
    (void)arg;
    for (;;) {
        void *p = NULL;
        if (cudaMalloc(&p, 2048L * MIB) != cudaErrorMemoryAllocation) exit(4);
    }
    return NULL;
}

/* ---- handlers ---- */

static void exit_on_term(int sig) {
    (void)sig;
    exit(0);
}

static void _exit_on_alarm(int sig) {
    (void)sig;
    _exit(0);
}

static volatile sig_atomic_t handler_calls, handler_limit;

static void alloc_on_alarm(int sig) {
    (void)sig;
    if (handler_calls < handler_limit) {
        alloc_in_handler();
        handler_calls++;
    }
}

static void on(int sig, void (*handler)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigaction(sig, &sa, NULL);
}

/* ---- cancel with `idle`: the cancellation is pending at the first
 * allocation call ---- */

static volatile int cancel_sent;

static void *first_allocator(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&cancel_sent, __ATOMIC_ACQUIRE)) {
    }
    plant_leak();
    pthread_testcancel();
    return NULL;
}

/* ---- exec that fails ---- */

static void failed_exec(char **argv) {
    char *args[] = {argv[0], "clean", "idle", NULL};
    if (execv("/nonexistent/cudaleak-endings", args) == 0) exit(5);
    plant_after_exec();
}

/* Standard descriptors on /dev/null, as a daemon has them: the launcher's
 * pipes are not held open by it. */
static void detach(void) {
    setsid();
    int fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2) close(fd);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: endings WAY MOMENT [THREADS [BLOCKS [DELAY_MS]]]\n");
        return 2;
    }
    const char *way = argv[1], *moment = argv[2];
    int threads = argc > 3 ? atoi(argv[3]) : 0;
    long blocks = argc > 4 ? atol(argv[4]) : 0;
    long delay_ms = argc > 5 ? atol(argv[5]) : 100;
#define WAY(w) (!strcmp(way, w))
#define MOMENT(m) (!strcmp(moment, m))

    int plants = !(WAY("clean") || WAY("linger") || WAY("daemon") || !strncmp(way, "exec_", 5));
    if (!plants) {
        void *p;
        CHECK(cudaMalloc(&p, 4096));
        CHECK(cudaFree(p));
        if (WAY("clean")) return 0;
    }
    if (WAY("term_exit")) on(SIGTERM, exit_on_term);
    if (WAY("alarm")) on(SIGALRM, _exit_on_alarm);

    pthread_t workers[64];
    if (threads > 64) threads = 64;
    if (WAY("cancel") && MOMENT("idle")) {
        pthread_t t;
        pthread_create(&t, NULL, first_allocator, NULL);
        pthread_cancel(t);
        __atomic_store_n(&cancel_sent, 1, __ATOMIC_RELEASE);
        void *res;
        pthread_join(t, &res);
        printf("ready\n");
        printf("first allocator %s\n", res == PTHREAD_CANCELED ? "cancelled" : "returned");
        return 0;
    }

    if (plants) plant_leak();

    if (WAY("nested")) {
        handler_limit = blocks > 0 ? blocks : 200;
        on(SIGALRM, alloc_on_alarm);
        struct itimerval t = {{0, 1000}, {0, 1000}};
        setitimer(ITIMER_REAL, &t, NULL);
        while (handler_calls < handler_limit) churn();
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        printf("ready\n");
        exit(9);
    }

    if (MOMENT("hook")) {
        if (WAY("cancel") && threads < 1) threads = 1;
        for (int i = 0; i < threads; i++) pthread_create(&workers[i], NULL, churn_forever, NULL);
    } else if (MOMENT("dump")) {
        leak_distinct_stacks(blocks);
        /* Without the library SIGUSR1 would end the program: the status
         * to compare with is that of a program with no dump. */
        if (dlsym(RTLD_DEFAULT, "cudaleak_dump")) kill(getpid(), SIGUSR1);
    } else if (MOMENT("oom")) {
        for (long i = 0; i < blocks; i++) hold();
        if (threads < 1) threads = 1;
        for (int i = 0; i < threads; i++) pthread_create(&workers[i], NULL, fail_forever, NULL);
    } else if (!MOMENT("idle")) {
        fprintf(stderr, "unknown moment %s\n", moment);
        return 2;
    }
    printf("ready\n");

    if (WAY("alarm")) {
        struct itimerval t = {{0, 0}, {delay_ms / 1000, (delay_ms % 1000) * 1000 + 1}};
        setitimer(ITIMER_REAL, &t, NULL);
    }
    if (WAY("alarm") || WAY("term_exit") || WAY("wait")) {
        /* The way out comes as a signal. */
        if (MOMENT("hook") && threads == 0) churn_forever(NULL);
        for (;;) pause();
    }

    /* The main thread's own way out, DELAY_MS from now: with `hook` and no
     * threads it churns meanwhile, so the way out comes just after a hook. */
    if (MOMENT("hook") && threads == 0) {
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        do {
            churn();
            clock_gettime(CLOCK_MONOTONIC, &now);
        } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 < delay_ms);
    } else {
        sleep_ms(delay_ms);
    }

    if (WAY("return")) return 0;
    if (WAY("exit")) exit(0);
    if (WAY("_exit")) _exit(0);
    if (WAY("fail")) exit(1);
    if (WAY("abort")) abort();
    if (WAY("segv")) *(volatile int *)0 = 1;
    if (WAY("exec")) {
        char *args[] = {argv[0], "clean", "idle", NULL};
        execv("/proc/self/exe", args);
        perror("execv");
        return 5;
    }
    if (WAY("exec_exit")) {
        failed_exec(argv);
        exit(0);
    }
    if (WAY("exec_kill")) {
        failed_exec(argv);
        kill(getpid(), SIGKILL);
    }
    if (WAY("exec_segv")) {
        failed_exec(argv);
        *(volatile int *)0 = 1;
    }
    if (WAY("exec_abort")) {
        failed_exec(argv);
        abort();
    }
    if (WAY("cancel")) {
        for (int i = 0; i < threads; i++) pthread_cancel(workers[i]);
        int cancelled = 0;
        for (int i = 0; i < threads; i++) {
            void *res;
            pthread_join(workers[i], &res);
            cancelled += res == PTHREAD_CANCELED;
        }
        printf("cancelled %d of %d\n", cancelled, threads);
        return 0;
    }
    if (WAY("fork")) {
        pid_t c = fork();
        if (c == 0) {
            plant_in_child();
            exit(0);
        }
        int st;
        waitpid(c, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (WAY("daemon") || WAY("linger")) {
        int pipefd[2];
        if (pipe(pipefd) != 0) return 6;
        pid_t c = fork();
        if (c == 0) {
            pid_t g = fork();
            if (g != 0) {
                /* The intermediate child tells the grandchild's pid, exits. */
                if (write(pipefd[1], &g, sizeof g) != sizeof g) _exit(7);
                _exit(0);
            }
            close(pipefd[0]);
            close(pipefd[1]);
            detach();
            if (WAY("linger")) {
                sleep_ms(60000);
                _exit(0);
            }
            sleep_ms(500);
            plant_in_daemon();
            exit(0);
        }
        pid_t g = 0;
        if (read(pipefd[0], &g, sizeof g) != sizeof g) return 6;
        waitpid(c, NULL, 0);
        if (WAY("linger")) printf("linger %d\n", (int)g);
        return 0;
    }
    fprintf(stderr, "unknown way %s\n", way);
    return 2;
}
