/*
 * Sixty call sites that all allocate through one helper, `raw`: the C twin
 * of tests/python/sixty_helper.py. Every stack's innermost frame is raw at
 * one line; only the frame below it tells the sites apart.
 *
 * Site i is the function augment_i (one SITE line each, in order); it leaks
 * one block of (i + 1) x 64 KiB through raw's one cudaMalloc line (marked
 * HELPER). 60 blocks, 1830 x 64 KiB leaked in all, one group per site.
 */
#include "common.h"

#define UNIT (64 * 1024)

static void *kept[60];

__attribute__((noinline)) void *raw(size_t nbytes) {
    void *p;
    CHECK(cudaMalloc(&p, nbytes)); /* HELPER */
    return p;
}

/* Each on its own line, so that each site has a line of its own; the store
 * after the call keeps the site's frame on the stack. */
#define SITE(i) \
    __attribute__((noinline)) void augment_##i(void) { kept[i] = raw((size_t)((i) + 1) * UNIT); }

SITE(0)
SITE(1)
SITE(2)
SITE(3)
SITE(4)
SITE(5)
SITE(6)
SITE(7)
SITE(8)
SITE(9)
SITE(10)
SITE(11)
SITE(12)
SITE(13)
SITE(14)
SITE(15)
SITE(16)
SITE(17)
SITE(18)
SITE(19)
SITE(20)
SITE(21)
SITE(22)
SITE(23)
SITE(24)
SITE(25)
SITE(26)
SITE(27)
SITE(28)
SITE(29)
SITE(30)
SITE(31)
SITE(32)
SITE(33)
SITE(34)
SITE(35)
SITE(36)
SITE(37)
SITE(38)
SITE(39)
SITE(40)
SITE(41)
SITE(42)
SITE(43)
SITE(44)
SITE(45)
SITE(46)
SITE(47)
SITE(48)
SITE(49)
SITE(50)
SITE(51)
SITE(52)
SITE(53)
SITE(54)
SITE(55)
SITE(56)
SITE(57)
SITE(58)
SITE(59)

typedef void (*site_fn)(void);

int main(void) {
    site_fn sites[] = {
        augment_0, augment_1, augment_2, augment_3, augment_4, augment_5, augment_6, augment_7,
        augment_8, augment_9, augment_10, augment_11, augment_12, augment_13, augment_14, augment_15,
        augment_16, augment_17, augment_18, augment_19, augment_20, augment_21, augment_22, augment_23,
        augment_24, augment_25, augment_26, augment_27, augment_28, augment_29, augment_30, augment_31,
        augment_32, augment_33, augment_34, augment_35, augment_36, augment_37, augment_38, augment_39,
        augment_40, augment_41, augment_42, augment_43, augment_44, augment_45, augment_46, augment_47,
        augment_48, augment_49, augment_50, augment_51, augment_52, augment_53, augment_54, augment_55,
        augment_56, augment_57, augment_58, augment_59,
    };
    for (int i = 0; i < 60; i++) sites[i]();
    return 0;
}
