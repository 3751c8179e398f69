/* Calls into libstripped.so (tests/c/stripped_lib.c), which leaks once. */
void stripped_entry(void);

int main(void) {
    stripped_entry();
    return 0;
}
