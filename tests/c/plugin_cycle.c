/*
 * plugin_cycle N PLUGIN: N times, loads PLUGIN with RTLD_NOW | RTLD_LOCAL,
 * calls its plugin_leak() (one leaked block each time) and unloads it
 * again, checking it is gone. A host of short-lived plugins.
 * Exit status: 0, or the first failing step / plugin_leak's value.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*plugin_fn)(void);

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int rounds = atoi(argv[1]);
    for (int i = 0; i < rounds; i++) {
        void *h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlopen %s: %s\n", argv[2], dlerror());
            return 20;
        }
        plugin_fn f = (plugin_fn)dlsym(h, "plugin_leak");
        if (!f) return 21;
        int rc = f();
        if (rc) {
            fprintf(stderr, "round %d: plugin_leak returned %d\n", i, rc);
            return rc;
        }
        if (dlclose(h)) return 22;
        if (dlopen(argv[2], RTLD_NOW | RTLD_NOLOAD)) return 23; /* still loaded */
    }
    return 0;
}
