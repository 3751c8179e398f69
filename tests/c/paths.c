/*
 * Leaks one block from each of many call paths, visited in an order that
 * changes the innermost level, the outermost, several apart and the depth
 * between one allocation and the next: the fast unwinder splices each
 * stack from the last one and must give what libgcc's gives.
 * Levels 0 (outermost) to 4 go through route_a or route_b by one bit of
 * the path; bit 5 adds route_big, with a larger frame, above level 2. The
 * block of path p has (p + 1) * 16 bytes: a group per path.
 */
#include "common.h"

static void route(int path, int level);

/* Different after the call (not a tail call), so that the compiler does
 * not fold the two functions into one. */
volatile int went_a, went_b;

__attribute__((noinline)) void route_a(int path, int level) {
    route(path, level + 1);
    went_a = level;
}

__attribute__((noinline)) void route_b(int path, int level) {
    route(path, level + 1);
    went_b = level + 1;
}

__attribute__((noinline)) void route_big(int path, int level) {
    volatile char pad[200];
    pad[0] = (char)level;
    if (path >> level & 1)
        route_a(path, level);
    else
        route_b(path, level);
    pad[1] = pad[0];
}

__attribute__((noinline)) void allocate_for(int path) {
    void *p;
    CHECK(cudaMalloc(&p, (size_t)(path + 1) * 16)); /* LEAK path */
}

__attribute__((noinline)) static void route(int path, int level) {
    if (level == 5)
        allocate_for(path);
    else if (level == 2 && (path & 32))
        route_big(path, level);
    else if (path >> level & 1)
        route_a(path, level);
    else
        route_b(path, level);
    __asm__ volatile("" ::: "memory");
}

/* With "cycle": 16 paths spread over every level, taken in the same
 * order 8 times (a training step's ops each step), fewer than the logs a
 * thread keeps: a capture replays the log that followed the last one.
 * Odd rounds leave out the path at their own index, so that the path
 * after it is not the one that followed the path before it. */
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "cycle") == 0) {
        for (int round = 0; round < 8; round++)
            for (int i = 0; i < 16; i++)
                if (!(round & 1) || i != round) route(i * 37 & 63, 0);
        return 0;
    }
    unsigned x = 12345;
    for (int i = 0; i < 64; i++) route(i ^ (i >> 1), 0); /* Gray code: one level at a time */
    for (int i = 0; i < 64; i++) route(i, 0);            /* counting: the outer levels most */
    for (int i = 0; i < 300; i++) {
        x = x * 1103515245u + 12345u;
        route((int)(x >> 16) & 63, 0);
    }
    return 0;
}
