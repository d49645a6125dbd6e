/*
 * The slot table: every task in the process, addressed by index.
 * See table.c for the layout and the free list's invariants.
 */
#ifndef ATAP_TABLE_H
#define ATAP_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "slot.h"

#define TABLE_FIRST_LOG2 8u /* the first block holds 256 slots */
#define TABLE_BLOCKS 23u
#define TABLE_MAX_INDEX ((UINT32_C(256) << TABLE_BLOCKS) - 256u) /* exclusive */

/* The slot at index, or NULL when no memory is behind it (never issued). */
struct atap_slot *atap__table_slot(uint32_t index);

/* A free slot's index, with *gen the generation to give it; -ENOMEM. */
int atap__table_alloc(uint32_t *index, uint32_t *gen);

/* Gives a slot whose task is gone back (or retires it at GEN_MAX). */
void atap__table_free(uint32_t index, uint32_t gen);

size_t atap__table_live(void);
size_t atap__table_span(void);
size_t atap__table_peak(void);
int atap__table_trim(size_t *released);

#endif
