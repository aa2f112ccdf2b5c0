/* rawsend: the C sender of bench/switch_rate.py (--sender c). Built at run time by
 * bench/rawsend.py with cc into build/bench/ (outside git), never committed as a binary.
 *
 * Sends prebuilt contribution frames from one or more hosts' raw sockets, a batch (a full
 * pool) per host with one sendmmsg, then waits for the batch's results on every host, as
 * the Python sender does, batch after batch; so the switch, not this loop, is what a rate
 * measures as long as this process's CPU is not the limit.
 *
 *   rawsend FRAME_LEN BATCH BATCHES TIMEOUT_MS NETNS:IFACE:FILE [NETNS:IFACE:FILE ...]
 *
 * FILE holds BATCH * BATCHES frames of FRAME_LEN bytes, in sending order. NETNS is a path
 * to a network namespace (/run/netns/NAME); the socket is made inside it. The process
 * prints "ready", waits for a line on stdin (all senders start together), then prints
 * one line: start and end (CLOCK_MONOTONIC seconds), results missing, user and system
 * CPU seconds.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif
#define MAX_PORTS 64
#define RX_BUF 2048

struct port {
	int fd;
	unsigned char *frames;
};

static void die(const char *what)
{
	perror(what);
	exit(2);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A raw socket on iface inside the namespace at netns, receiving incoming IPv4 only. */
static int open_port(const char *netns, const char *iface)
{
	int ns = open(netns, O_RDONLY | O_CLOEXEC);
	if (ns < 0 || setns(ns, CLONE_NEWNET) < 0)
		die(netns);
	close(ns);
	int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_IP));
	if (fd < 0)
		die("socket");
	int one = 1, rcvbuf = 8 << 20;
	setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
	struct sockaddr_ll addr = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IP)};
	addr.sll_ifindex = if_nametoindex(iface);
	if (addr.sll_ifindex == 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
		die(iface);
	return fd;
}

static unsigned char *read_frames(const char *path, size_t bytes)
{
	unsigned char *buf = malloc(bytes);
	FILE *f = fopen(path, "rb");
	if (!buf || !f || fread(buf, 1, bytes, f) != bytes)
		die(path);
	fclose(f);
	return buf;
}

/* Send count frames of len bytes from frames, sendmmsg until all are gone. */
static void send_batch(int fd, unsigned char *frames, int count, int len)
{
	struct mmsghdr msgs[count];
	struct iovec iov[count];
	memset(msgs, 0, sizeof(msgs));
	for (int i = 0; i < count; i++) {
		iov[i].iov_base = frames + (size_t)i * len;
		iov[i].iov_len = len;
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	for (int sent = 0; sent < count;) {
		int n = sendmmsg(fd, msgs + sent, count - sent, 0);
		if (n < 0)
			usleep(50); /* ENOBUFS: the device queue is full for a moment */
		else
			sent += n;
	}
}

/* Receive up to count result frames (UDP over IPv4), waiting at most timeout_ms for each
 * gap; the number that did not come. */
static int await_results(int fd, int count, int timeout_ms)
{
	static unsigned char bufs[64][RX_BUF];
	struct mmsghdr msgs[64];
	struct iovec iov[64];
	int got = 0;
	while (got < count) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, timeout_ms) <= 0)
			break;
		int want = count - got < 64 ? count - got : 64;
		memset(msgs, 0, sizeof(msgs));
		for (int i = 0; i < want; i++) {
			iov[i].iov_base = bufs[i];
			iov[i].iov_len = RX_BUF;
			msgs[i].msg_hdr.msg_iov = &iov[i];
			msgs[i].msg_hdr.msg_iovlen = 1;
		}
		int n = recvmmsg(fd, msgs, want, MSG_DONTWAIT, NULL);
		for (int i = 0; i < n; i++)
			if (msgs[i].msg_len > 23 && bufs[i][23] == IPPROTO_UDP)
				got++;
	}
	return count - got;
}

int main(int argc, char **argv)
{
	if (argc < 6 || argc - 5 > MAX_PORTS) {
		fprintf(stderr, "usage: %s FRAME_LEN BATCH BATCHES TIMEOUT_MS NETNS:IFACE:FILE...\n",
			argv[0]);
		return 1;
	}
	int len = atoi(argv[1]), batch = atoi(argv[2]), batches = atoi(argv[3]);
	int timeout_ms = atoi(argv[4]), nports = argc - 5;
	struct port ports[MAX_PORTS];
	for (int i = 0; i < nports; i++) {
		char *netns = strtok(argv[5 + i], ":"), *iface = strtok(NULL, ":");
		char *file = strtok(NULL, ":");
		if (!netns || !iface || !file)
			return 1;
		ports[i].fd = open_port(netns, iface);
		ports[i].frames = read_frames(file, (size_t)len * batch * batches);
	}
	printf("ready\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	int missing = 0;
	double start = now();
	for (int b = 0; b < batches; b++) {
		for (int i = 0; i < nports; i++)
			send_batch(ports[i].fd, ports[i].frames + (size_t)b * batch * len, batch, len);
		for (int i = 0; i < nports; i++)
			missing += await_results(ports[i].fd, batch, timeout_ms);
	}
	double end = now();
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	printf("%.6f %.6f %d %.6f %.6f\n", start, end, missing,
	       ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6,
	       ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6);
	return 0;
}
