/* nvidia-cuda-mps-control stand-in. `-d` starts a control daemon listening on $CUDA_MPS_PIPE_DIRECTORY/control
 * (default /tmp/nvidia-mps) that keeps the settings it is sent; `-d -M` starts it in multi-user mode. Without
 * `-d`, each line of stdin is sent to the daemon and its answer printed. Dynamically linked against glibc like
 * the real one; every call is recorded beside the binary, and the daemon appends what it did to control.log in
 * $CUDA_MPS_LOG_DIRECTORY.
 *
 * Who may connect, as with the real daemon (it reads each peer's credentials from the socket):
 * - CUDA clients (the mock libcuda sends `client <pid>` and keeps the connection for its lifetime) get the MPS
 *   server of their own UID. Without -M there is one server at a time: a client of another UID than the
 *   running server's is queued ("pending") until every client of that server is gone, then the server is
 *   restarted for the queued UID. With -M every client, of any UID, is served by one root server at once.
 * - The daemon starts a server for a UID by switching to it: a daemon that does not run as root serves its own
 *   UID only, and refuses clients of any other.
 * - Control commands (limits, quit, queries) come from root or the daemon's own user only: a tenant cannot
 *   raise its limits or stop the daemon. A refusal is answered `ERR ...`, which the client prints on stderr
 *   and exits 1 for. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include "record.h"

#define MAX_CONN 64

static const char *dir_env(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

static void daemon_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void daemon_log(const char *fmt, ...) {
    char path[4096];
    snprintf(path, sizeof path, "%s/control.log", dir_env("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"));
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

enum { FREE, NEW, COMMAND, ACTIVE, PENDING };  /* NEW: connected, not yet said what it is */
struct conn { int fd; int state; uid_t uid; pid_t pid; char buf[1024]; size_t len; };

static struct conn conns[MAX_CONN];
static int multi_user;
static uid_t daemon_uid;
static long server_uid = -1;  /* the UID the running MPS server serves; -1: none */
static char threads[32] = "100", limits[2048] = "";

static void reply(struct conn *c, const char *text) {
    dprintf(c->fd, "%s\n", text);
}

static void drop(struct conn *c) {
    close(c->fd);
    c->state = FREE;
}

static int active_clients(void) {
    int n = 0;
    for (int i = 0; i < MAX_CONN; i++) n += conns[i].state == ACTIVE;
    return n;
}

static void serve_client(struct conn *c, uid_t as) {
    char text[64];
    c->state = ACTIVE;
    server_uid = as;
    snprintf(text, sizeof text, "server %u", (unsigned)as);
    reply(c, text);
}

/* The running server has no client left: start one for the first queued UID and serve its clients. */
static void promote_pending(void) {
    if (active_clients()) return;
    server_uid = -1;
    for (int i = 0; i < MAX_CONN; i++) {
        if (conns[i].state != PENDING) continue;
        if (server_uid == -1) daemon_log("[daemon] Starting new server for user %u", (unsigned)conns[i].uid);
        if (server_uid == -1 || (uid_t)server_uid == conns[i].uid) serve_client(&conns[i], conns[i].uid);
    }
}

static void new_client(struct conn *c) {
    if (multi_user) {
        daemon_log("[daemon] NEW CLIENT %d from user %u: served by the multi-user server (user 0)", (int)c->pid, (unsigned)c->uid);
        serve_client(c, 0);
        return;
    }
    if (daemon_uid != 0 && c->uid != daemon_uid) {
        daemon_log("[daemon] NEW CLIENT %d from user %u: cannot start a server for it (daemon runs as user %u)",
                   (int)c->pid, (unsigned)c->uid, (unsigned)daemon_uid);
        reply(c, "ERR the MPS control daemon cannot start a server for this user");
        drop(c);
        return;
    }
    if (server_uid == -1 || (uid_t)server_uid == c->uid || !active_clients()) {
        if (server_uid != (long)c->uid) daemon_log("[daemon] Starting new server for user %u", (unsigned)c->uid);
        daemon_log("[daemon] NEW CLIENT %d from user %u: served", (int)c->pid, (unsigned)c->uid);
        serve_client(c, c->uid);
        return;
    }
    daemon_log("[daemon] NEW CLIENT %d from user %u: server of user %ld is busy, push client to pending list",
               (int)c->pid, (unsigned)c->uid, server_uid);
    c->state = PENDING;
    reply(c, "pending");
}

/* One control command; returns 1 when the daemon must exit. */
static int command(struct conn *c, const char *line) {
    char out[2200] = "";
    char a[512], b[512];
    daemon_log("[daemon] %s", line);
    if (c->uid != 0 && c->uid != daemon_uid) {
        daemon_log("[daemon] refused a command from user %u", (unsigned)c->uid);
        reply(c, "ERR only root or the user running the MPS control daemon may control it");
        return 0;
    }
    if (!strcmp(line, "quit")) {
        daemon_log("[daemon] quit");
        return 1;
    } else if (sscanf(line, "set_default_active_thread_percentage %31s", threads) == 1) {
        snprintf(out, sizeof out, "%s", threads);
    } else if (!strcmp(line, "get_default_active_thread_percentage")) {
        snprintf(out, sizeof out, "%s", threads);
    } else if (sscanf(line, "set_default_device_pinned_mem_limit %511s %511s", a, b) == 2) {
        size_t used = strlen(limits);
        snprintf(limits + used, sizeof limits - used, "%s%s=%s", used ? "," : "", a, b);
    } else if (!strcmp(line, "get_default_device_pinned_mem_limit")) {
        snprintf(out, sizeof out, "%s", limits);
    } else if (!strcmp(line, "get_server_list")) {
        if (server_uid != -1) snprintf(out, sizeof out, "user %ld clients %d", server_uid, active_clients());
    } else {
        snprintf(out, sizeof out, "Unrecognized command %s", line);
    }
    reply(c, out);
    return 0;
}

/* A complete line from a connection that has not said what it is yet. Returns 1 when the daemon must exit. */
static int first_line(struct conn *c, const char *line) {
    int pid;
    if (sscanf(line, "client %d", &pid) == 1) {
        c->pid = pid;
        new_client(c);
        return 0;
    }
    c->state = COMMAND;
    return command(c, line);
}

static int serve(const char *socket_path) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path);
    unlink(socket_path);
    if (bind(s, (struct sockaddr *)&addr, sizeof addr) || listen(s, 16)) return 1;
    chmod(socket_path, 0666);  /* who may do what is decided from the peer's credentials */
    daemon_log("[daemon] started devices=%s user=%u%s", dir_env("CUDA_VISIBLE_DEVICES", "all"), (unsigned)daemon_uid,
               multi_user ? " multi-user" : "");
    for (;;) {
        struct pollfd fds[MAX_CONN + 1];
        int idx[MAX_CONN + 1], n = 0;
        fds[n].fd = s; fds[n].events = POLLIN; idx[n++] = -1;
        for (int i = 0; i < MAX_CONN; i++)
            if (conns[i].state != FREE) { fds[n].fd = conns[i].fd; fds[n].events = POLLIN; idx[n++] = i; }
        if (poll(fds, n, -1) < 0) { if (errno == EINTR) continue; return 1; }
        if (fds[0].revents & POLLIN) {
            int fd = accept(s, NULL, NULL);
            int slot = -1;
            for (int i = 0; i < MAX_CONN && slot < 0; i++) if (conns[i].state == FREE) slot = i;
            struct ucred cred;
            socklen_t len = sizeof cred;
            if (fd >= 0 && (slot < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len))) {
                daemon_log("[daemon] User did not send valid credentials");
                close(fd);
            } else if (fd >= 0) {
                conns[slot] = (struct conn){.fd = fd, .state = NEW, .uid = cred.uid, .pid = cred.pid};
            }
        }
        for (int k = 1; k < n; k++) {
            struct conn *c = &conns[idx[k]];
            if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR)) || c->state == FREE) continue;
            ssize_t got = read(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len);
            if (got <= 0) {  /* a client process ended (its CUDA context is gone) or a command connection closed */
                int was_active = c->state == ACTIVE;
                if (was_active) daemon_log("[daemon] client %d of user %u exited", (int)c->pid, (unsigned)c->uid);
                drop(c);
                if (was_active) promote_pending();
                continue;
            }
            c->len += (size_t)got;
            c->buf[c->len] = 0;
            char *nl;
            while ((nl = strchr(c->buf, '\n'))) {
                *nl = 0;
                int quit = 0;
                if (c->state == NEW) quit = first_line(c, c->buf);
                else if (c->state == COMMAND) quit = command(c, c->buf);
                size_t used = (size_t)(nl + 1 - c->buf);
                memmove(c->buf, nl + 1, c->len - used + 1);
                c->len -= used;
                if (quit) {
                    unlink(socket_path);
                    return 0;
                }
                if (c->state == FREE) break;
            }
        }
    }
}

int main(int argc, char **argv) {
    const char *pipe_dir = dir_env("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps");
    char socket_path[4096];
    snprintf(socket_path, sizeof socket_path, "%s/control", pipe_dir);
    int daemon = argc >= 2 && !strcmp(argv[1], "-d");
    if (daemon) {
        for (int i = 2; i < argc; i++) {
            if (!strcmp(argv[i], "-M")) multi_user = 1;
            else { fprintf(stderr, "Unknown option %s\n", argv[i]); return 1; }
        }
        record(argc, argv, pipe_dir);
        daemon_uid = geteuid();
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
        signal(SIGPIPE, SIG_IGN);
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
        char answer[2200];
        int is_quit = !strncmp(line, "quit", 4);
        if (fgets(answer, sizeof answer, io)) {
            if (!strncmp(answer, "ERR ", 4)) {
                fputs(answer + 4, stderr);
                fclose(io);
                return 1;
            }
            if (!is_quit) fputs(answer, stdout);
        }
        fclose(io);
    }
    return 0;
}
