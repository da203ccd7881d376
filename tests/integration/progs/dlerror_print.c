/* Prints dlerror()'s message of a failed dlopen through one output function, as its first call
 * of that function in the process: glibc frees the message at the next dl call, so an interposer
 * that looked its real function up then would print freed memory.
 *   dlerror_print fprintf|fputs|fwrite|write|putc
 *   dlerror_print none: dlerror() at the start of main, before any dl call of the program's own:
 *                       "(none)", unless something before main (the shim) left an error behind */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *how = argc > 1 ? argv[1] : "fprintf";
    if (!strcmp(how, "none")) {
        const char *e = dlerror();
        printf("%s\n", e ? e : "(none)");
        return 0;
    }
    if (dlopen("libdpshim_test_nowhere.so", RTLD_NOW)) return 2;
    if (!strcmp(how, "fprintf"))
        fprintf(stderr, "%s\n", dlerror());
    else if (!strcmp(how, "fputs"))
        fputs(dlerror(), stderr), fputs("\n", stderr);
    else if (!strcmp(how, "fwrite")) {
        const char *e = dlerror();
        fwrite(e, 1, strlen(e), stderr), fwrite("\n", 1, 1, stderr);
    } else if (!strcmp(how, "write")) {
        const char *e = dlerror();
        if (write(STDERR_FILENO, e, strlen(e)) < 0 || write(STDERR_FILENO, "\n", 1) < 0) return 1;
    } else if (!strcmp(how, "putc")) {
        for (const char *e = dlerror(); *e; e++)
            putc(*e, stderr);
        putc('\n', stderr);
    } else
        return 2;
    return 0;
}
