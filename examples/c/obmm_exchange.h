/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * obmm_exchange.h - the obmm.exchange TCP protocol (version 1) for the C examples.
 *
 * Request and response are each one frame "u32 LE length | payload"; a request
 * payload is "OBMX" 1 op [name] (op 1 = GET, 2 = LIST), a response payload
 * "OBMX" 1 status body (0 OK: handle / names, 1 NOT_FOUND, 2 BAD_REQUEST).
 * One request per connection.  Same protocol as pylib/obmm/exchange.py.
 */
#ifndef OBMM_EXCHANGE_H
#define OBMM_EXCHANGE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "obmm_handle.h"

#define OBMM_EXCHANGE_DEFAULT_PORT 13857
#define OBMM_EXCHANGE_HEAD 6 /* "OBMX", version, op or status */
#define OBMM_EXCHANGE_MAX_FRAME 65536
#define OBMM_EXCHANGE_OP_GET 1
#define OBMM_EXCHANGE_OP_LIST 2
#define OBMM_EXCHANGE_ST_OK 0
#define OBMM_EXCHANGE_ST_NOT_FOUND 1
#define OBMM_EXCHANGE_ST_BAD_REQUEST 2

/* The frame length and the payload head for `body_len` bytes of body. */
static inline void obmm_exchange_head(uint8_t out[4 + OBMM_EXCHANGE_HEAD], size_t body_len,
				      uint8_t op_or_status)
{
	obmm_put_le(out, OBMM_EXCHANGE_HEAD + body_len, 4);
	memcpy(out + 4, "OBMX", 4);
	out[8] = 1;
	out[9] = op_or_status;
}

/* Whether a received payload starts with a version 1 head. */
static inline int obmm_exchange_head_ok(const uint8_t *payload, size_t len)
{
	return len >= OBMM_EXCHANGE_HEAD && !memcmp(payload, "OBMX", 4) && payload[4] == 1;
}

/* Send (sending != 0) or receive exactly len bytes; -1 on error or a closed peer. */
static inline int obmm_io_all(int fd, void *buf, size_t len, int sending)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = sending ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);

		if (n == 0)
			return -1;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* obmm_io_all for a buffer that is only read (sending does not write it). */
static inline int obmm_send_all(int fd, const void *buf, size_t len)
{
	return obmm_io_all(fd, (void *)buf, len, 1);
}

#endif /* OBMM_EXCHANGE_H */
