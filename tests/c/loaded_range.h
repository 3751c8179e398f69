/* The loaded range of the object that holds an address, for test programs
 * that unload an object and reserve where it was (so that no later object
 * is loaded there and its old frames belong to no object). Include after
 * defining _GNU_SOURCE. */
#ifndef CUDALEAK_TEST_LOADED_RANGE_H
#define CUDALEAK_TEST_LOADED_RANGE_H

#include <link.h>
#include <stdint.h>

/* [lo, hi), page-aligned, of the object holding `addr`. */
struct range { uintptr_t addr, lo, hi; };

static int find_range(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct range *r = data;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        if (p->p_type != PT_LOAD) continue;
        uintptr_t a = info->dlpi_addr + p->p_vaddr;
        if (a < lo) lo = a;
        if (a + p->p_memsz > hi) hi = a + p->p_memsz;
    }
    if (lo <= r->addr && r->addr < hi) {
        r->lo = lo & ~(uintptr_t)0xfff;
        r->hi = (hi + 0xfff) & ~(uintptr_t)0xfff;
        return 1;
    }
    return 0;
}

#endif
