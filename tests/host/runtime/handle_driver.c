// SPDX-License-Identifier: GPL-2.0-or-later
/* Test driver for examples/c/obmm_handle.h: reads "E <fields>" (encode) or "D <hex>" (decode) lines. */
#include <stdio.h>
#include <stdlib.h>
#include <inttypes.h>
#include "obmm_handle.h"

static void hex_in(const char *s, uint8_t *out, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sscanf(s + 2 * i, "%2hhx", &out[i]);
}

int main(void)
{
	char line[1024];

	while (fgets(line, sizeof(line), stdin)) {
		struct obmm_handle h;
		uint8_t buf[512];

		if (line[0] == 'E') {
			char seid[33], deid[33];
			unsigned nid, dist;

			sscanf(line + 2, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu32 " %" SCNu32
			       " %" SCNu32 " %" SCNd32 " %32s %32s %u %u", &h.mem_id, &h.length,
			       &h.uba, &h.tokenid, &h.scna, &h.dcna, &h.pxm_numa, seid, deid,
			       &nid, &dist);
			hex_in(seid, h.seid, 16);
			hex_in(deid, h.deid, 16);
			h.node_id = (uint16_t)nid;
			h.base_dist = (uint8_t)dist;
			obmm_handle_encode(&h, buf);
			for (int i = 0; i < OBMM_HANDLE_SIZE; i++)
				printf("%02x", buf[i]);
			printf("\n");
		} else {
			size_t n = (strlen(line + 2) - 1) / 2;
			enum obmm_handle_status st;

			hex_in(line + 2, buf, n);
			st = obmm_handle_decode(buf, n, &h);
			if (st != OBMM_HANDLE_OK) {
				printf("ERR %d %s\n", st, obmm_handle_strerror(st));
				continue;
			}
			printf("OK %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu32 " %" PRIu32 " %"
			       PRIu32 " %" PRId32 " %u %u\n", h.mem_id, h.length, h.uba,
			       h.tokenid, h.scna, h.dcna, h.pxm_numa, h.node_id, h.base_dist);
		}
		fflush(stdout);
	}
	return 0;
}
