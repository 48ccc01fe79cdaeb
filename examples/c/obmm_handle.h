/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * obmm_handle.h - the obmm-testbed handle wire format in C (header only).
 *
 * Byte-compatible twin of pylib/obmm/handle.py (format version 1): 88
 * bytes, little-endian, magic "OBMH", CRC32 (zlib polynomial) over bytes
 * 0..83.  tests/host/runtime/test_handle_c.py checks both sides against each other.
 *
 *   off size field        off size field
 *   0   4    magic        44  4    pxm_numa (s32)
 *   4   2    version      48  16   seid
 *   6   2    total_len    64  16   deid
 *   8   8    mem_id       80  2    node_id
 *   16  8    length       82  1    base_dist
 *   24  8    uba          83  1    reserved (0)
 *   32  4    tokenid      84  4    crc32
 *   36  4    scna
 *   40  4    dcna
 */
#ifndef OBMM_HANDLE_H
#define OBMM_HANDLE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define OBMM_HANDLE_MAGIC "OBMH"
#define OBMM_HANDLE_VERSION 1
#define OBMM_HANDLE_SIZE 88
#define OBMM_HANDLE_EID_SIZE 16
#define OBMM_HANDLE_CRC_OFFSET 84

struct obmm_handle {
	uint64_t mem_id;
	uint64_t length;
	uint64_t uba;
	uint32_t tokenid;
	uint32_t scna;
	uint32_t dcna;
	int32_t pxm_numa;
	uint8_t seid[OBMM_HANDLE_EID_SIZE];
	uint8_t deid[OBMM_HANDLE_EID_SIZE];
	uint16_t node_id;
	uint8_t base_dist;
};

enum obmm_handle_status {
	OBMM_HANDLE_OK = 0,
	OBMM_HANDLE_TRUNCATED,
	OBMM_HANDLE_BAD_MAGIC,
	OBMM_HANDLE_NEWER_VERSION,
	OBMM_HANDLE_BAD_VERSION,
	OBMM_HANDLE_BAD_LENGTH,
	OBMM_HANDLE_BAD_CRC,
	OBMM_HANDLE_BAD_RESERVED,
};

static inline const char *obmm_handle_strerror(enum obmm_handle_status st)
{
	switch (st) {
	case OBMM_HANDLE_OK: return "ok";
	case OBMM_HANDLE_TRUNCATED: return "handle truncated or with trailing bytes";
	case OBMM_HANDLE_BAD_MAGIC: return "not an obmm handle (bad magic)";
	case OBMM_HANDLE_NEWER_VERSION: return "handle version is newer than this program supports";
	case OBMM_HANDLE_BAD_VERSION: return "invalid handle version 0";
	case OBMM_HANDLE_BAD_LENGTH: return "handle length field is not 88";
	case OBMM_HANDLE_BAD_CRC: return "handle CRC mismatch (corrupted)";
	case OBMM_HANDLE_BAD_RESERVED: return "handle reserved byte is not zero";
	}
	return "unknown handle error";
}

static inline uint32_t obmm_handle_crc32(const uint8_t *p, size_t n)
{
	uint32_t crc = 0xffffffffu;

	while (n--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0xedb88320u & -(crc & 1u));
	}
	return ~crc;
}

static inline void obmm_put_le(uint8_t *p, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t obmm_get_le(const uint8_t *p, int bytes)
{
	uint64_t v = 0;

	for (int i = 0; i < bytes; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static inline void obmm_handle_encode(const struct obmm_handle *h,
				      uint8_t out[OBMM_HANDLE_SIZE])
{
	memset(out, 0, OBMM_HANDLE_SIZE);
	memcpy(out, OBMM_HANDLE_MAGIC, 4);
	obmm_put_le(out + 4, OBMM_HANDLE_VERSION, 2);
	obmm_put_le(out + 6, OBMM_HANDLE_SIZE, 2);
	obmm_put_le(out + 8, h->mem_id, 8);
	obmm_put_le(out + 16, h->length, 8);
	obmm_put_le(out + 24, h->uba, 8);
	obmm_put_le(out + 32, h->tokenid, 4);
	obmm_put_le(out + 36, h->scna, 4);
	obmm_put_le(out + 40, h->dcna, 4);
	obmm_put_le(out + 44, (uint32_t)h->pxm_numa, 4);
	memcpy(out + 48, h->seid, OBMM_HANDLE_EID_SIZE);
	memcpy(out + 64, h->deid, OBMM_HANDLE_EID_SIZE);
	obmm_put_le(out + 80, h->node_id, 2);
	out[82] = h->base_dist;
	obmm_put_le(out + OBMM_HANDLE_CRC_OFFSET,
		    obmm_handle_crc32(out, OBMM_HANDLE_CRC_OFFSET), 4);
}

/* Same checks, in the same order, as obmm.handle.Handle.decode. */
static inline enum obmm_handle_status
obmm_handle_decode(const uint8_t *buf, size_t len, struct obmm_handle *h)
{
	uint64_t version;

	if (len < 8)
		return OBMM_HANDLE_TRUNCATED;
	if (memcmp(buf, OBMM_HANDLE_MAGIC, 4) != 0)
		return OBMM_HANDLE_BAD_MAGIC;
	version = obmm_get_le(buf + 4, 2);
	if (version > OBMM_HANDLE_VERSION)
		return OBMM_HANDLE_NEWER_VERSION;
	if (version == 0)
		return OBMM_HANDLE_BAD_VERSION;
	if (len != obmm_get_le(buf + 6, 2))
		return OBMM_HANDLE_TRUNCATED;
	if (len != OBMM_HANDLE_SIZE)
		return OBMM_HANDLE_BAD_LENGTH;
	if (obmm_get_le(buf + OBMM_HANDLE_CRC_OFFSET, 4) !=
	    obmm_handle_crc32(buf, OBMM_HANDLE_CRC_OFFSET))
		return OBMM_HANDLE_BAD_CRC;
	if (buf[83] != 0)
		return OBMM_HANDLE_BAD_RESERVED;
	h->mem_id = obmm_get_le(buf + 8, 8);
	h->length = obmm_get_le(buf + 16, 8);
	h->uba = obmm_get_le(buf + 24, 8);
	h->tokenid = (uint32_t)obmm_get_le(buf + 32, 4);
	h->scna = (uint32_t)obmm_get_le(buf + 36, 4);
	h->dcna = (uint32_t)obmm_get_le(buf + 40, 4);
	h->pxm_numa = (int32_t)(uint32_t)obmm_get_le(buf + 44, 4);
	memcpy(h->seid, buf + 48, OBMM_HANDLE_EID_SIZE);
	memcpy(h->deid, buf + 64, OBMM_HANDLE_EID_SIZE);
	h->node_id = (uint16_t)obmm_get_le(buf + 80, 2);
	h->base_dist = buf[82];
	return OBMM_HANDLE_OK;
}

#endif /* OBMM_HANDLE_H */
