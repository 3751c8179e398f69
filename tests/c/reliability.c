/*
 * Reports that must not be lost, signals that must not kill, limits that
 * must hold. Modes (argv[1]):
 *   exec_parent   leaks one block, then execv()s itself as exec_child.
 *   exec_child    leaks two blocks (the new image's own).
 *   execv_path    leaks one block, then tries execv() once per entry of a
 *                 PATH whose first two directories do not exist (as
 *                 Python's os.execvp does), the last one its own: the new
 *                 image is exec_child_marker. Prints the run markers of
 *                 this pid after the first failure.
 *   exec_child_marker  exec_child, then prints this pid's run markers.
 *   usr1_ignored_exec  ignores SIGUSR1, leaks one block, prints whether
 *                 SIGUSR1 is still ignored, then execs itself without
 *                 LD_PRELOAD as usr1_plain_child.
 *   usr1_plain_child  sends itself SIGUSR1 and prints that it survived.
 *   term_own_group  moves into a process group of its own, leaks one
 *                 block, restores SIGTERM's default action, then
 *                 kill(0, SIGTERM): the whole group, itself included (a
 *                 launcher stopping its workers).
 *   exec_fails    leaks one block, an execv that fails, then one more.
 *   usr1_early    sends itself SIGUSR1 before any CUDA call (which ends it
 *                 by the default action: no handler of ours before the
 *                 first allocation call), then would leak one block.
 *   leak_once     leaks one block and returns 0.
 *   term_at_exit  leaks 2^12 blocks from distinct stacks (a slow exit
 *                 report), and a thread sends SIGTERM to the process as
 *                 soon as the exit report's temporary file appears.
 *   planted_link  a live dump, then a symbolic link planted at the name the
 *                 exit report will take; leaks one block.
 *   small_stack [BYTES [USED]]  a thread with a 16 KiB (or BYTES) stack
 *                 calls cudaMalloc (a leak) and cudaMalloc/cudaFree; main
 *                 makes no CUDA call. With USED, the thread first takes
 *                 USED bytes of its stack (its deepest point).
 *   stacks BITS   leaks 2^BITS blocks of 1 byte, each from its own stack.
 *   churn_stacks BITS  the same, each block freed at once (no leak): for
 *                 measuring the trace depot (docs/performance.md).
 */
#include "common.h"

#include <alloca.h>

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

void leak_before_exec(void) { void *p; CHECK(cudaMalloc(&p, 1000)); /* LEAK before exec */ }
void leak_after_exec(void) { void *p; CHECK(cudaMalloc(&p, 2000)); /* LEAK after exec */ }
void leak_once(void) { void *p; CHECK(cudaMalloc(&p, 1000)); /* LEAK once */ }

/* Each path through the recursion is a distinct native stack: bit i of
 * `path` picks one of two call sites at depth i. */
static int free_at_once; /* churn_stacks: free each block at once */
static void __attribute__((noinline)) leak_at(void) {
    void *p;
    CHECK(cudaMalloc(&p, 1));
    if (free_at_once) CHECK(cudaFree(p));
}
static void __attribute__((noinline)) branch(unsigned path, int depth);
static void __attribute__((noinline)) branch_a(unsigned path, int depth) { branch(path >> 1, depth - 1); }
static void __attribute__((noinline)) branch_b(unsigned path, int depth) { branch(path >> 1, depth - 1); }
static void __attribute__((noinline)) branch(unsigned path, int depth) {
    if (depth == 0) {
        leak_at();
    } else if (path & 1) {
        branch_a(path, depth);
    } else {
        branch_b(path, depth);
    }
    __asm__ volatile("" ::: "memory"); /* no tail calls: every frame stays */
}
static void leak_distinct_stacks(int bits) {
    for (unsigned path = 0; path < (1u << bits); path++) branch(path, bits);
}

static volatile int watching;

static void *term_when_report_starts(void *arg) {
    (void)arg;
    int fd = inotify_init();
    if (fd < 0 || inotify_add_watch(fd, ".", IN_CREATE) < 0) {
        perror("inotify");
        _exit(4);
    }
    __atomic_store_n(&watching, 1, __ATOMIC_RELEASE);
    char buf[4096] __attribute__((aligned(8)));
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        for (char *p = buf; n > 0 && p < buf + n;) {
            struct inotify_event *e = (struct inotify_event *)p;
            size_t len = e->len ? strlen(e->name) : 0;
            if (len > 4 && !strncmp(e->name, ".cudaleak.", 10) && !strcmp(e->name + len - 4, ".tmp")) {
                kill(getpid(), SIGTERM);
                return NULL;
            }
            p += sizeof *e + e->len;
        }
    }
}

/* The run markers of this pid in the working directory. */
static int markers_of_this_pid(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, ".cudaleak-active.%d.", (int)getpid());
    int n = 0;
    DIR *d = opendir(".");
    struct dirent *e;
    while (d && (e = readdir(d))) n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

static size_t stack_used;

static void *small_stack_thread(void *arg) {
    (void)arg;
    void *keep, *tmp;
    if (stack_used) {
        volatile char *deep = alloca(stack_used);
        deep[0] = 1;
        deep[stack_used - 1] = 1;
    }
    CHECK(cudaMalloc(&keep, 4096)); /* LEAK small stack */
    CHECK(cudaMalloc(&tmp, 64));
    CHECK(cudaFree(tmp));
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!strcmp(mode, "exec_parent")) {
        leak_before_exec();
        char *args[] = {argv[0], "exec_child", NULL};
        execv("/proc/self/exe", args);
        perror("execv");
        return 5;
    } else if (!strcmp(mode, "exec_fails")) {
        leak_before_exec();
        char *args[] = {"nothing", NULL};
        if (execv("/nonexistent/cudaleak-test", args) == 0) return 5;
        leak_once(); /* the process goes on after a failed exec */
    } else if (!strcmp(mode, "exec_child")) {
        for (int i = 0; i < 2; i++) leak_after_exec();
    } else if (!strcmp(mode, "execv_path")) {
        leak_before_exec();
        char self[PATH_MAX], dir[PATH_MAX];
        if (!realpath("/proc/self/exe", self)) return 5;
        strcpy(dir, self);
        *strrchr(dir, '/') = 0;
        const char *name = strrchr(self, '/') + 1;
        const char *path[] = {"/nonexistent/cudaleak-a", "/nonexistent/cudaleak-b", dir};
        char *args[] = {argv[0], "exec_child_marker", NULL};
        for (int i = 0; i < 3; i++) {
            char file[PATH_MAX];
            snprintf(file, sizeof file, "%s/%s", path[i], name);
            execv(file, args);
            if (i == 0) printf("markers after a failed exec: %d\n", markers_of_this_pid());
        }
        perror("execv");
        return 5;
    } else if (!strcmp(mode, "exec_child_marker")) {
        for (int i = 0; i < 2; i++) leak_after_exec();
        printf("markers in the new image: %d\n", markers_of_this_pid());
    } else if (!strcmp(mode, "usr1_ignored_exec")) {
        extern char **environ;
        signal(SIGUSR1, SIG_IGN);
        leak_once();
        struct sigaction cur;
        sigaction(SIGUSR1, NULL, &cur);
        printf("SIGUSR1 still ignored: %d\n", cur.sa_handler == SIG_IGN);
        char *env[256];
        int n = 0;
        for (char **e = environ; *e && n < 255; e++)
            if (strncmp(*e, "LD_PRELOAD=", 11)) env[n++] = *e;
        env[n] = NULL;
        char *args[] = {argv[0], "usr1_plain_child", NULL};
        execve("/proc/self/exe", args, env);
        perror("execve");
        return 5;
    } else if (!strcmp(mode, "term_own_group")) {
        if (setpgid(0, 0) != 0) return 5;
        leak_once();
        signal(SIGTERM, SIG_DFL); /* as CPython does before re-raising */
        kill(0, SIGTERM);
        return 6; /* not reached */
    } else if (!strcmp(mode, "usr1_plain_child")) {
        kill(getpid(), SIGUSR1);
        printf("the child survived SIGUSR1\n");
    } else if (!strcmp(mode, "usr1_early")) {
        kill(getpid(), SIGUSR1);
        leak_once();
    } else if (!strcmp(mode, "leak_once")) {
        leak_once();
    } else if (!strcmp(mode, "term_at_exit")) {
        pthread_t t;
        leak_distinct_stacks(12);
        pthread_create(&t, NULL, term_when_report_starts, NULL);
        while (!__atomic_load_n(&watching, __ATOMIC_ACQUIRE)) usleep(1000);
        printf("leaked\n");
        /* returns: the exit report starts, and SIGTERM arrives during it */
    } else if (!strcmp(mode, "planted_link")) {
        int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "cudaleak_dump");
        leak_once();
        if (!dump || dump("first") != 0) return 6;
        DIR *d = opendir(".");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            size_t len = strlen(e->d_name);
            const char *suffix = ".1.api.json";
            if (len > strlen(suffix) && !strcmp(e->d_name + len - strlen(suffix), suffix)) {
                char next[PATH_MAX];
                snprintf(next, sizeof next, "%.*s.2.exit.json", (int)(len - strlen(suffix)), e->d_name);
                if (symlink("planted-target", next) != 0) return 7;
                printf("planted %s\n", next);
            }
        }
        if (d) closedir(d);
    } else if (!strcmp(mode, "small_stack")) {
        pthread_attr_t attr;
        pthread_t t;
        pthread_attr_init(&attr);
        size_t bytes = argc > 2 ? (size_t)atol(argv[2]) : 16384;
        stack_used = argc > 3 ? (size_t)atol(argv[3]) : 0;
        if (pthread_attr_setstacksize(&attr, bytes) != 0) return 8;
        if (pthread_create(&t, &attr, small_stack_thread, NULL) != 0) return 9;
        pthread_join(t, NULL);
    } else if (!strcmp(mode, "churn_stacks")) {
        free_at_once = 1;
        leak_distinct_stacks(argc > 2 ? atoi(argv[2]) : 10);
    } else if (!strcmp(mode, "stacks")) {
        leak_distinct_stacks(argc > 2 ? atoi(argv[2]) : 10);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
