/* A distributed worker that learns its rank after it started, as
 * torch.multiprocessing.spawn workers often do (os.environ["RANK"] = ...
 * before init_process_group), then leaks one block of 4096 bytes.
 * argv[1]: the rank it sets. */
#include "common.h"

#include <stdlib.h>

int main(int argc, char **argv) {
    setenv("RANK", argc > 1 ? argv[1] : "5", 1);
    void *p;
    CHECK(cudaMalloc(&p, 4096));
    return 0;
}
