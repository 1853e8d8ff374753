/* The [aot] step's compiles, made byte-for-byte repeatable (kernel_cache.py builds this and preloads it).
 *
 * nvcc names its temporary files tmpxft_<pid>_..., and cudafe++ folds the process id into the module id
 * that names anonymous namespaces and the fatbinary's registration symbols: two compiles of the same
 * source in two processes give different objects, and no nvcc flag turns it off (CUDA 13.0, measured).
 * For NVIDIA's compiler drivers only, getpid() answers a number derived from the command line and the
 * working folder instead: the same compile gets the same number, two different compiles (which run in
 * parallel, sharing TMPDIR) get different ones. Every other program sees its real process id. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *const TOOLS[] = {"nvcc", "cudafe++", "cicc", "ptxas", NULL};

static int is_cuda_tool(void) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = 0;
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    for (const char *const *tool = TOOLS; *tool; tool++)
        if (!strcmp(base, *tool)) return 1;
    return 0;
}

static unsigned int fnv1a(unsigned int hash, const char *bytes, ssize_t n) {
    for (ssize_t i = 0; i < n; i++) {
        hash ^= (unsigned char)bytes[i];
        hash *= 16777619u;
    }
    return hash;
}

pid_t getpid(void) {
    static pid_t fixed;
    if (fixed) return fixed;
    pid_t real = (pid_t)syscall(SYS_getpid);
    if (!is_cuda_tool()) return real;
    int fd = open("/proc/self/cmdline", O_RDONLY);
    if (fd < 0) return real;
    unsigned int hash = 2166136261u;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) hash = fnv1a(hash, buf, n);
    close(fd);
    if (getcwd(buf, sizeof buf)) hash = fnv1a(hash, buf, (ssize_t)strlen(buf));
    fixed = (pid_t)(1 + hash % 4000000u);
    return fixed;
}
