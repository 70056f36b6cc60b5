/* preload_probe: proves that the process it runs in allocates with coralloc.
 * It is built without linking coralloc: coral_owns is found with dlsym in
 * whatever the process loaded (LD_PRELOAD=libcoralloc.so), and the blocks of
 * malloc, calloc, realloc and glibc's strdup must be coralloc's.
 * Exit 0 and "coralloc active" when they are, 1 otherwise. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    int (*owns)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "coral_owns");
    if (!owns) {
        fprintf(stderr, "preload_probe: coral_owns not found: coralloc is not "
                        "loaded in this process\n");
        return 1;
    }
    void *m = malloc(1), *c = calloc(3, 7), *r = realloc(malloc(10), 5000);
    char *s = strdup("probe");
    int ok = m && c && r && s && owns(m) && owns(c) && owns(r) && owns(s);
    printf("malloc %s, calloc %s, realloc %s, strdup %s\n",
           m && owns(m) ? "coralloc" : "NOT coralloc", c && owns(c) ? "coralloc" : "NOT coralloc",
           r && owns(r) ? "coralloc" : "NOT coralloc", s && owns(s) ? "coralloc" : "NOT coralloc");
    free(m);
    free(c);
    free(r);
    free(s);
    if (!ok) {
        fprintf(stderr, "preload_probe: malloc is not served by coralloc\n");
        return 1;
    }
    puts("coralloc active");
    return 0;
}
