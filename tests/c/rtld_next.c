/* Prints probe() = 11 when RTLD_NEXT semantics hold for the caller. */
#include <stdio.h>

int probe(void);

int main(void) {
    printf("probe=%d\n", probe());
    return 0;
}
