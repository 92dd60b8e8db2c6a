/* The sandbox container of the real node's Pods (scripts/kube-node.sh):
 * it holds the Pod's namespaces while the Pod lives, reaps the orphans
 * handed to it as the namespace's first process, and leaves at once on
 * SIGTERM or SIGINT. Built statically, it is the image's only file. */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction on = {0};
  on.sa_handler = leave;
  sigaction(SIGTERM, &on, NULL);
  sigaction(SIGINT, &on, NULL);
  on.sa_handler = reap;
  on.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  sigaction(SIGCHLD, &on, NULL);
  for (;;) {
    pause();
  }
}
