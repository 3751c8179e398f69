/*
 * Live dumps and the ways out of a process. Modes (argv[1]):
 *   busy      a worker thread allocates and frees until the file "stop"
 *             appears in the working directory (the test sends signals
 *             meanwhile); leaks exactly one block first. Prints "ready".
 *   phases    four phases, a cudaleak_dump() after each: one group grows
 *             every phase, one grows in phases 1-2 only, one is allocated
 *             once, and churn leaves nothing.
 *   trickle   leaks one block, then waits for the next interval dump to
 *             appear, seven times (not a sleep of 50 ms between blocks
 *             counting on about seven dumps in 1.5 s: that could fail
 *             on a loaded machine).
 *   exit_now  leaks one block, then _exit(7).
 *   wait      leaks one block, prints "ready", then waits for a signal.
 *   storm     4 threads × 20000 alloc/free pairs, each leaking one block,
 *             while the test sends signals; prints "ready" first. Then
 *             waits (at most 10 s) for a signal report: the pairs take
 *             about 30 ms, and a test thread scheduled late sent every
 *             signal after them (the gate's CI run, 2026-11-26).
 *   alone     the main thread alone: 100000 alloc/free pairs, then one
 *             leak, while the test sends signals; prints "ready" first.
 *             Each dump pauses the thread that owns the maps alone
 *             instead of taking their locks (sole.rs, case 8). Then
 *             waits for a signal report, as storm does.
 *   checkpoint  the in-process API from C.
 *   chain     installs its own SIGUSR1 handler before any CUDA call, then
 *             leaks one block and waits until its handler ran and a report
 *             exists: the library must still call the earlier handler.
 */
#include "common.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int (*dump_api)(const char *);
static uint64_t (*checkpoint_api)(void);
static int (*live_since_api)(uint64_t, uint64_t *, uint64_t *);
static char *(*leaks_since_api)(uint64_t);
static void (*free_api)(char *);

static void load_api(void) {
    dump_api = (int (*)(const char *))dlsym(RTLD_DEFAULT, "cudaleak_dump");
    checkpoint_api = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "cudaleak_checkpoint");
    live_since_api = (int (*)(uint64_t, uint64_t *, uint64_t *))dlsym(RTLD_DEFAULT, "cudaleak_live_since");
    leaks_since_api = (char *(*)(uint64_t))dlsym(RTLD_DEFAULT, "cudaleak_leaks_since_json");
    free_api = (void (*)(char *))dlsym(RTLD_DEFAULT, "cudaleak_free");
    if (!dump_api || !checkpoint_api || !live_since_api || !leaks_since_api || !free_api) {
        fprintf(stderr, "the cudaleak API is not loaded\n");
        exit(9);
    }
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

void leak_once(void) { void *p; CHECK(cudaMalloc(&p, 1000)); /* LEAK once */ }
void grow(void) { void *p; CHECK(cudaMalloc(&p, 100)); /* LEAK grow */ }
void fill_cache(void) { void *p; CHECK(cudaMalloc(&p, 10)); /* LEAK cache */ }
void churn(void) { void *p; CHECK(cudaMalloc(&p, 5)); CHECK(cudaFree(p)); }

static volatile int stop;
static volatile sig_atomic_t own_handler_calls;

static void own_handler(int sig) {
    (void)sig;
    own_handler_calls++;
}

static int reports_in_cwd(void) {
    int n = 0;
    FILE *ls = popen("ls cudaleak.*.signal.json 2>/dev/null | wc -l", "r");
    if (ls) {
        if (fscanf(ls, "%d", &n) != 1) n = 0;
        pclose(ls);
    }
    return n;
}

/* The highest sequence number among the interval reports in the working
 * directory (cudaleak.<host>.<pid>.<instance>.<seq>.interval.json). */
static long newest_interval_dump(void) {
    long best = 0;
    DIR *d = opendir(".");
    struct dirent *e;
    const char *suffix = ".interval.json";
    while (d && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "cudaleak.", 9) || len <= strlen(suffix) ||
            strcmp(e->d_name + len - strlen(suffix), suffix))
            continue;
        size_t end = len - strlen(suffix), start = end;
        while (start > 0 && e->d_name[start - 1] != '.') start--;
        long seq = strtol(e->d_name + start, NULL, 10);
        if (seq > best) best = seq;
    }
    if (d) closedir(d);
    return best;
}

static void *busy_worker(void *arg) {
    (void)arg;
    struct stat st;
    for (long i = 0; !stop; i++) {
        churn();
        if (i % 1000 == 0 && stat("stop", &st) == 0) stop = 1;
    }
    return NULL;
}

static void *storm_worker(void *arg) {
    (void)arg;
    for (int i = 0; i < 20000; i++) churn();
    leak_once();
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "busy";
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!strcmp(mode, "busy")) {
        pthread_t t;
        leak_once();
        pthread_create(&t, NULL, busy_worker, NULL);
        printf("ready\n");
        pthread_join(t, NULL);
    } else if (!strcmp(mode, "phases")) {
        load_api();
        for (int phase = 1; phase <= 4; phase++) {
            grow();
            if (phase == 1) leak_once();
            if (phase <= 2) fill_cache();
            for (int i = 0; i < 10; i++) churn();
            char reason[32];
            snprintf(reason, sizeof reason, "phase %d", phase);
            if (dump_api(reason) != 0) exit(10);
        }
    } else if (!strcmp(mode, "trickle")) {
        for (int i = 0; i < 7; i++) {
            long before = newest_interval_dump();
            grow();
            /* The event itself: the next interval dump is written. */
            for (int ms = 0; ms < 60000 && newest_interval_dump() <= before; ms += 5) sleep_ms(5);
        }
    } else if (!strcmp(mode, "exit_now")) {
        leak_once();
        _exit(7);
    } else if (!strcmp(mode, "wait")) {
        leak_once();
        printf("ready\n");
        for (;;) pause();
    } else if (!strcmp(mode, "storm")) {
        pthread_t t[4];
        churn(); /* first allocation call: handlers and dumper in place */
        printf("ready\n");
        for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, storm_worker, NULL);
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
        for (int i = 0; i < 1000 && reports_in_cwd() == 0; i++) sleep_ms(10);
    } else if (!strcmp(mode, "alone")) {
        churn();
        printf("ready\n");
        for (int i = 0; i < 100000; i++) churn();
        leak_once();
        for (int i = 0; i < 1000 && reports_in_cwd() == 0; i++) sleep_ms(10);
    } else if (!strcmp(mode, "chain")) {
        signal(SIGUSR1, own_handler);
        leak_once();
        printf("ready\n");
        for (int i = 0; i < 1000 && (own_handler_calls == 0 || reports_in_cwd() == 0); i++) sleep_ms(10);
        printf("chained=%d reports=%d\n", (int)own_handler_calls, reports_in_cwd());
    } else if (!strcmp(mode, "checkpoint")) {
        load_api();
        leak_once(); /* before the checkpoint: not counted */
        uint64_t cp = checkpoint_api();
        void *a, *b, *c;
        CHECK(cudaMalloc(&a, 300)); /* LEAK after checkpoint */
        CHECK(cudaMalloc(&b, 400)); /* LEAK after checkpoint */
        CHECK(cudaMalloc(&c, 500));
        CHECK(cudaFree(c));
        uint64_t blocks = 0, bytes = 0;
        if (live_since_api(cp, &blocks, &bytes) != 0) exit(11);
        printf("since=%llu,%llu\n", (unsigned long long)blocks, (unsigned long long)bytes);
        char *json = leaks_since_api(cp);
        if (!json) exit(12);
        printf("%s\n", json);
        free_api(json);
        CHECK(cudaFree(a));
        CHECK(cudaFree(b));
        live_since_api(cp, &blocks, &bytes);
        printf("after=%llu,%llu\n", (unsigned long long)blocks, (unsigned long long)bytes);
    }
    return 0;
}
