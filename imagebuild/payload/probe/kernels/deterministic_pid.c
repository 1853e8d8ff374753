/* The [aot] step's compiles, made byte-for-byte repeatable (kernel_cache.py builds this and preloads it).
 *
 * nvcc names its temporary files tmpxft_<pid>_..., and cudafe++ folds the process id into the module id
 * that names anonymous namespaces and the fatbinary's registration symbols: two compiles of the same
 * source in two processes give different objects, and no nvcc flag turns it off (CUDA 13.0, measured).
 * For NVIDIA's compiler drivers only, getpid() answers a number derived from the command line and the
 * working folder instead: the same compile gets the same number, two different compiles (which run in
 * parallel, sharing TMPDIR) get different ones. Every other program sees its real process id.
 *
 * cudafe++ also folds the source file's modification time into the module id (measured: one compile
 * command run twice gives the same object, and a different one once the .cu was touched). Sources the
 * kernel step generates are written anew in every build, so for cudafe++ only, a stat answers
 * SOURCE_MTIME as every file's modification time. cudafe++ (CUDA 13.0) imports __xstat alone; the real
 * one is called through its versioned name, and every other program gets its answer unchanged.
 * IMAGEBUILD_SHIM_REAL_MTIME set turns this half off (the tests' negative control).
 *
 * SGLang (0.5.x, sglang/kernels/jit/utils/compile/loader.py) compiles each module in a folder named
 * .staging-<uuid4> and renames it into its cache once built. That folder is the compile's working folder
 * and cudafe++ hashes the source's full path (--orig_src_path_name) into the module id, so for these tools
 * a path component starting with STAGING counts as STAGING alone: in the number above, and in the source
 * path nvcc hands its subtools (rewritten in argv before main runs; it names the source, nothing opens it).
 * Two processes never build one module at once here (kernels_aot.py gives each module to one process). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SOURCE_MTIME 315532800 /* 1980-01-01T00:00:00Z, the zip epoch */
#if defined(__aarch64__)
#define XSTAT_VERSION "GLIBC_2.17"
#else
#define XSTAT_VERSION "GLIBC_2.2.5"
#endif

static const char *const TOOLS[] = {"nvcc", "cudafe++", "cicc", "ptxas", NULL};
static const char *const MODULE_ID_TOOLS[] = {"cudafe++", NULL};
static const char STAGING[] = ".staging-";
static const char SOURCE_PATH_FLAG[] = "--orig_src_path_name";

static int is_tool(const char *const *tools) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = 0;
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    for (const char *const *tool = tools; *tool; tool++)
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

/* bytes[0..n) with every path component that starts with STAGING cut to STAGING, into out (NUL-terminated);
 * returns its length. out holds at least n + 1 bytes. */
static size_t without_staging(const char *bytes, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int starts = (i == 0 || bytes[i - 1] == '/' || bytes[i - 1] == 0) && n - i >= sizeof STAGING - 1 &&
                     !memcmp(bytes + i, STAGING, sizeof STAGING - 1);
        if (!starts) {
            out[k++] = bytes[i++];
            continue;
        }
        memcpy(out + k, STAGING, sizeof STAGING - 1);
        k += sizeof STAGING - 1;
        while (i < n && bytes[i] != '/' && bytes[i] != 0) i++;
    }
    out[k] = 0;
    return k;
}

/* glibc hands a preloaded library's constructors the argv main will see: the source path is rewritten there. */
__attribute__((constructor)) static void normalize_source_path(int argc, char **argv, char **envp) {
    (void)envp;
    if (!is_tool(TOOLS)) return;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], SOURCE_PATH_FLAG) || !strstr(argv[i + 1], STAGING)) continue;
        size_t n = strlen(argv[i + 1]);
        char *path = malloc(n + 1);
        if (!path) return;
        without_staging(argv[i + 1], n, path);
        argv[i + 1] = path;
    }
}

pid_t getpid(void) {
    static pid_t fixed;
    if (fixed) return fixed;
    pid_t real = (pid_t)syscall(SYS_getpid);
    if (!is_tool(TOOLS)) return real;
    int fd = open("/proc/self/cmdline", O_RDONLY);
    if (fd < 0) return real;
    size_t size = 1 << 16, n = 0;
    char *line = malloc(size), *cut = NULL;
    ssize_t got;
    while (line && (got = read(fd, line + n, size - n)) > 0)
        if ((n += (size_t)got) == size) line = realloc(line, size *= 2);
    close(fd);
    if (line && (cut = malloc(n > 4096 ? n + 1 : 4097))) {
        unsigned int hash = fnv1a(2166136261u, cut, (ssize_t)without_staging(line, n, cut));
        char folder[4096];
        if (getcwd(folder, sizeof folder)) hash = fnv1a(hash, cut, (ssize_t)without_staging(folder, strlen(folder), cut));
        fixed = (pid_t)(1 + hash % 4000000u);
    }
    free(line);
    free(cut);
    return fixed ? fixed : real;
}

/* cudafe++ hashes its working folder into the module id too: it reads it with STAGING components cut. */
char *getcwd(char *buf, size_t size) {
    static char *(*real)(char *, size_t);
    if (!real) real = (char *(*)(char *, size_t))dlsym(RTLD_NEXT, "getcwd");
    char *got = real ? real(buf, size) : NULL;
    if (got && is_tool(MODULE_ID_TOOLS) && strstr(got, STAGING)) without_staging(got, strlen(got), got);
    return got;
}

int __xstat(int version, const char *path, struct stat *buf) {
    static int (*real)(int, const char *, struct stat *);
    static int module_id_tool = -1;
    if (!real) real = (int (*)(int, const char *, struct stat *))dlvsym(RTLD_NEXT, "__xstat", XSTAT_VERSION);
    if (!real) return stat(path, buf);
    int rc = real(version, path, buf);
    if (module_id_tool < 0) module_id_tool = is_tool(MODULE_ID_TOOLS) && !getenv("IMAGEBUILD_SHIM_REAL_MTIME");
    if (rc == 0 && module_id_tool) {
        buf->st_mtim.tv_sec = SOURCE_MTIME;
        buf->st_mtim.tv_nsec = 0;
    }
    return rc;
}
