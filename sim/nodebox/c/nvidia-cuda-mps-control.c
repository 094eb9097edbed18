/* nvidia-cuda-mps-control stand-in. `-d` starts a control daemon listening on $CUDA_MPS_PIPE_DIRECTORY/control
 * (default /tmp/nvidia-mps) that keeps the settings it is sent; without `-d`, each line of stdin is sent to the
 * daemon and its answer printed. Dynamically linked against glibc like the real one; every call is recorded
 * beside the binary, and the daemon appends what it was told to control.log in $CUDA_MPS_LOG_DIRECTORY. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include "record.h"

static const char *dir_env(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

static void daemon_log(const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/control.log", dir_env("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"));
    FILE *f = fopen(path, "a");
    if (f) { fprintf(f, "%s\n", text); fclose(f); }
}

static int serve(const char *socket_path) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path);
    unlink(socket_path);
    if (bind(s, (struct sockaddr *)&addr, sizeof addr) || listen(s, 8)) return 1;
    chmod(socket_path, 0666);  /* clients of any user connect (the daemon checks nothing more here) */
    char threads[32] = "100", limits[2048] = "";
    char line[1024];
    snprintf(line, sizeof line, "[daemon] started devices=%s", dir_env("CUDA_VISIBLE_DEVICES", "all"));
    daemon_log(line);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) { if (errno == EINTR) continue; return 1; }
        FILE *in = fdopen(c, "r+");
        while (fgets(line, sizeof line, in)) {
            line[strcspn(line, "\n")] = 0;
            char reply[2200] = "";
            char a[512], b[512];
            if (!strcmp(line, "quit")) {
                daemon_log("[daemon] quit");
                fclose(in);
                unlink(socket_path);
                return 0;
            } else if (sscanf(line, "set_default_active_thread_percentage %31s", threads) == 1) {
                snprintf(reply, sizeof reply, "%s", threads);
            } else if (!strcmp(line, "get_default_active_thread_percentage")) {
                snprintf(reply, sizeof reply, "%s", threads);
            } else if (sscanf(line, "set_default_device_pinned_mem_limit %511s %511s", a, b) == 2) {
                size_t used = strlen(limits);
                snprintf(limits + used, sizeof limits - used, "%s%s=%s", used ? "," : "", a, b);
            } else if (!strcmp(line, "get_default_device_pinned_mem_limit")) {
                snprintf(reply, sizeof reply, "%s", limits);
            } else if (!strcmp(line, "get_server_list")) {
                reply[0] = 0;
            } else {
                snprintf(reply, sizeof reply, "Unrecognized command %s", line);
            }
            char logged[1200];
            snprintf(logged, sizeof logged, "[daemon] %s", line);
            daemon_log(logged);
            fprintf(in, "%s\n", reply);
            fflush(in);
        }
        fclose(in);
    }
}

int main(int argc, char **argv) {
    const char *pipe_dir = dir_env("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps");
    char socket_path[4096];
    snprintf(socket_path, sizeof socket_path, "%s/control", pipe_dir);
    if (argc == 2 && !strcmp(argv[1], "-d")) {
        record(argc, argv, pipe_dir);
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid > 0) {
            for (int i = 0; i < 200; i++) {  /* return once the daemon listens, as the real one does */
                struct stat st;
                if (!stat(socket_path, &st)) return 0;
                usleep(10000);
            }
            fprintf(stderr, "An instance of this daemon is not running: %s was not created\n", socket_path);
            return 1;
        }
        setsid();
        signal(SIGHUP, SIG_IGN);
        freopen("/dev/null", "r", stdin);
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        _exit(serve(socket_path));
    }
    record(argc, argv, pipe_dir);
    char line[1024];
    while (fgets(line, sizeof line, stdin)) {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path);
        if (connect(s, (struct sockaddr *)&addr, sizeof addr)) {
            fprintf(stderr, "Cannot find MPS control daemon process\n");
            return 1;
        }
        FILE *io = fdopen(s, "r+");
        fputs(line, io);
        if (!strchr(line, '\n')) fputc('\n', io);
        fflush(io);
        char reply[2200];
        if (strncmp(line, "quit", 4) && fgets(reply, sizeof reply, io)) fputs(reply, stdout);
        fclose(io);
    }
    return 0;
}
