/*
 * Modules and libraries: each loaded one is a block of kind "module" with
 * the loading line's stack, its bytes the image's device globals
 * (.nv.global and .nv.global.init: 1 MiB + 4 KiB here), until unloaded.
 * A module loaded and kept is reported, never a leak.
 *
 *   modules once          cuModuleLoadData of a cubin, kept
 *   modules unloaded      loaded and unloaded: nothing
 *   modules loop          the same load 5 times, never unloaded, a live dump
 *                         after each
 *   modules fatbin        cuModuleLoadFatBinary of a fatbin holding the cubin,
 *                         and cuModuleLoadData of the runtime's wrapper of it
 *   modules file PATH     the cubin written to PATH, cuModuleLoad(PATH)
 *   modules library PATH  cuLibraryLoadData kept; cuLibraryLoadFromFile(PATH)
 *                         unloaded
 *   modules reset         a module and a library loaded, then a reset
 *   modules ptx           cuModuleLoadData of PTX text: bytes not known (0)
 *   modules with_leak     a module kept and a cudaMalloc never freed
 *   modules region        cudaleak_live_since over a module load: 0 blocks
 */
#define _GNU_SOURCE
#include "common.h"

#include <dlfcn.h>
#include <stdint.h>

#define GLOBALS (1u << 20)
#define GLOBALS_INIT 4096u

static unsigned char image[4096];
static size_t image_len;

static void put(size_t at, const void *v, size_t n) { memcpy(image + at, v, n); }

/* A 64-bit little-endian ELF with a null section, .text.kernel, .nv.global
 * (NOBITS), .nv.global.init, .nv.constant0.kernel and the section names. */
static void build_cubin(void) {
    static const char names[] =
        "\0.text.kernel\0.nv.global\0.nv.global.init\0.nv.constant0.kernel\0.shstrtab";
    const uint32_t name_at[] = {0, 1, 14, 25, 41, 62};
    const uint64_t size[] = {0, 256, GLOBALS, GLOBALS_INIT, 352, sizeof names};
    uint64_t names_at = 64, shoff = 64 + sizeof names;
    uint16_t shentsize = 64, shnum = 6, shstrndx = 5;
    memset(image, 0, sizeof image);
    put(0, "\x7f" "ELF", 4);
    image[4] = 2; /* 64-bit */
    image[5] = 1; /* little-endian */
    put(0x28, &shoff, 8);
    put(0x3a, &shentsize, 2);
    put(0x3c, &shnum, 2);
    put(0x3e, &shstrndx, 2);
    put(names_at, names, sizeof names);
    for (int i = 0; i < shnum; i++) {
        size_t h = shoff + (size_t)i * 64;
        uint64_t off = i == 5 ? names_at : 0;
        put(h, &name_at[i], 4);
        put(h + 0x18, &off, 8);
        put(h + 0x20, &size[i], 8);
    }
    image_len = shoff + (size_t)shnum * 64;
}

/* A fatbin (magic 0xBA55ED50) of one uncompressed ELF entry: the cubin. */
static unsigned char fatbin[8192];
static void build_fatbin(void) {
    uint32_t magic = 0xBA55ED50u, entry_header = 64;
    uint16_t header_size = 16, kind = 2;
    uint64_t payload = image_len, body = 64 + image_len;
    memset(fatbin, 0, sizeof fatbin);
    memcpy(fatbin, &magic, 4);
    memcpy(fatbin + 6, &header_size, 2);
    memcpy(fatbin + 8, &body, 8);
    memcpy(fatbin + 16, &kind, 2);
    memcpy(fatbin + 20, &entry_header, 4);
    memcpy(fatbin + 24, &payload, 8);
    memcpy(fatbin + 16 + 64, image, image_len);
}

static void write_cubin(const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(image, 1, image_len, f) != image_len || fclose(f)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(3);
    }
}

CUmodule load_once(void) { CUmodule m; CHECK(cuModuleLoadData(&m, image)); /* LOAD once */ return m; }

CUmodule load_in_loop(void) { CUmodule m; CHECK(cuModuleLoadData(&m, image)); /* LOAD loop */ return m; }

CUmodule load_fatbin(void) { CUmodule m; CHECK(cuModuleLoadFatBinary(&m, fatbin)); /* LOAD fatbin */ return m; }

/* The runtime's wrapper of a fatbin, as __cudaRegisterFatBinary gets it. */
CUmodule load_wrapper(void) {
    static struct { unsigned int magic, version; const void *data, *unused; } wrapper;
    wrapper.magic = 0x466243b1u;
    wrapper.version = 1;
    wrapper.data = fatbin;
    CUmodule m;
    CHECK(cuModuleLoadData(&m, &wrapper)); /* LOAD wrapper */
    return m;
}

CUmodule load_file(const char *p) { CUmodule m; CHECK(cuModuleLoad(&m, p)); /* LOAD file */ return m; }

CUlibrary load_library(void) {
    CUlibrary l;
    CHECK(cuLibraryLoadData(&l, image, NULL, NULL, 0, NULL, NULL, 0)); /* LOAD library */
    return l;
}

CUmodule load_ptx(void) {
    static const char ptx[] = "//\n.version 8.5\n.target sm_90\n.address_size 64\n";
    CUmodule m;
    CHECK(cuModuleLoadData(&m, ptx)); /* LOAD ptx */
    return m;
}

void *leak_device(void) { void *p; CHECK(cudaMalloc(&p, 4096)); /* LEAK malloc */ return p; }

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "once";
    build_cubin();
    build_fatbin();
    driver_context();
    if (!strcmp(mode, "once")) {
        load_once();
    } else if (!strcmp(mode, "unloaded")) {
        CHECK(cuModuleUnload(load_once()));
    } else if (!strcmp(mode, "loop")) {
        /* Under the library, a live dump after each load. */
        int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "cudaleak_dump");
        for (int i = 0; i < 5; i++) {
            load_in_loop();
            if (dump) dump("after a load");
        }
    } else if (!strcmp(mode, "fatbin")) {
        load_fatbin();
        load_wrapper();
    } else if (!strcmp(mode, "file") && argc > 2) {
        write_cubin(argv[2]);
        load_file(argv[2]);
    } else if (!strcmp(mode, "library") && argc > 2) {
        load_library();
        write_cubin(argv[2]);
        CUlibrary l;
        CHECK(cuLibraryLoadFromFile(&l, argv[2], NULL, NULL, 0, NULL, NULL, 0));
        CHECK(cuLibraryUnload(l));
    } else if (!strcmp(mode, "reset")) {
        /* A reset takes the module with its context, not the library. */
        load_once();
        load_library();
        CHECK(cuDevicePrimaryCtxReset(0));
    } else if (!strcmp(mode, "ptx")) {
        load_ptx();
    } else if (!strcmp(mode, "with_leak")) {
        load_once();
        leak_device();
    } else if (!strcmp(mode, "region")) {
        uint64_t (*checkpoint)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "cudaleak_checkpoint");
        int (*live_since)(uint64_t, uint64_t *, uint64_t *) =
            (int (*)(uint64_t, uint64_t *, uint64_t *))dlsym(RTLD_DEFAULT, "cudaleak_live_since");
        if (!checkpoint || !live_since) return 4;
        uint64_t cp = checkpoint(), blocks = 99, bytes = 99;
        load_once();
        CHECK(live_since(cp, &blocks, &bytes));
        printf("since the checkpoint: %llu blocks, %llu bytes\n", (unsigned long long)blocks,
               (unsigned long long)bytes);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
