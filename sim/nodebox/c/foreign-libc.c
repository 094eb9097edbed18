/* A libc.so.6 of "another glibc build": it has the soname but none of the GLIBC_2.x symbol versions this
 * machine's programs need, so the dynamic loader refuses any of our binaries it is loaded into
 * ("version `GLIBC_2.34' not found"), as a libc from a different distribution release would break them. Built
 * with -nostdlib: it depends on nothing. Should a loader ever run it, its constructor exits loudly. */
static void die(void) __attribute__((constructor));
static void die(void) {
    static const char msg[] = "nodebox: a foreign libc.so.6 (the host's) was loaded into this process\n";
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(1), "D"(2), "S"(msg), "d"(sizeof msg - 1) : "rcx", "r11", "memory");
    __asm__ volatile("syscall" : : "a"(231), "D"(127) : "rcx", "r11", "memory");
}
int nodebox_foreign_libc(void) { return 1; }
