/*
 * A program that closes fd 2 and reopens it on a data
 * file (argv[1]), then leaks one 512-byte block and exits. The library's
 * summary must not land in the data file.
 */
#include "common.h"

#include <fcntl.h>
#include <unistd.h>

void leak_into_data(void) { void *p; CHECK(cudaMalloc(&p, 512)); /* LEAK stderr reuse */ }

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    close(2);
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd != 2) return 3;
    const char data[] = "DATA\n";
    if (write(2, data, sizeof data - 1) != sizeof data - 1) return 4;
    leak_into_data();
    return 0;
}
