// Asks the driver's cuGetProcAddress_v2 for entry points and says where
// each answer lives (scripts/gpu-validate.sh, section `procaddr`; the
// checks are gpu/procaddr_checks.py's).
//
//   procaddr_probe NAME:VERSION:FLAGS...
//
// One line per argument on stdout:
//   NAME VERSION FLAGS RESULT STATUS MODULE SYMBOL
// RESULT is the call's CUresult, STATUS its CUdriverProcAddressQueryResult,
// MODULE the file name of the object holding the answer and SYMBOL the
// symbol dladdr names there ("-" for none). Run plainly it shows which
// variant the driver hands out for a version; under the library, that the
// library hands out its hook instead. Needs only libdl: the driver is
// opened as a program using the runtime opens it, by soname.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*init_fn)(unsigned int);
typedef int (*get_proc_fn)(const char *, void **, int, unsigned long long, int *);

static const char *base_name(const char *path) {
    const char *slash = path ? strrchr(path, '/') : NULL;
    return slash ? slash + 1 : (path ? path : "-");
}

int main(int argc, char **argv) {
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
        fprintf(stderr, "procaddr_probe: %s\n", dlerror());
        return 2;
    }
    init_fn init = (init_fn)dlsym(driver, "cuInit");
    get_proc_fn get_proc = (get_proc_fn)dlsym(driver, "cuGetProcAddress_v2");
    if (!init || !get_proc || init(0) != 0) {
        fprintf(stderr, "procaddr_probe: no cuInit or cuGetProcAddress_v2, or cuInit failed\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        char name[256];
        int version = 0;
        unsigned long long flags = 0;
        if (sscanf(argv[i], "%255[^:]:%d:%llu", name, &version, &flags) != 3) {
            fprintf(stderr, "procaddr_probe: bad argument %s (NAME:VERSION:FLAGS)\n", argv[i]);
            return 2;
        }
        void *fn = NULL;
        int status = -1;
        int rc = get_proc(name, &fn, version, flags, &status);
        Dl_info info;
        memset(&info, 0, sizeof info);
        int found = fn && dladdr(fn, &info);
        printf("%s %d %llu %d %d %s %s\n", name, version, flags, rc, status,
               found ? base_name(info.dli_fname) : "-", found && info.dli_sname ? info.dli_sname : "-");
    }
    return 0;
}
