/*
 * The kinds of park, one line each: PARK_KIND(NAME, ops), ops the kind's
 * const struct park_kind (park_int.h), defined in the kind's own file.
 * From this list park_int.h makes the PK_ numbers (PK_NAME, from 1, in the
 * list's order: a trace's TR_PARK event names the kind by it) and the
 * declarations of the kinds' entries, and park.c the table of them,
 * atap__park_kinds, which its manager's side (rearm, retry, forget) walks
 * in this order. A new kind is its own file and its line here
 * (src/README.md's recipe). No include guard: included by park_int.h and
 * park.c only, each time with PARK_KIND defined.
 */
PARK_KIND(FD, atap__park_kind_fd)         /* park_fd.c */
PARK_KIND(UNTIL, atap__park_kind_until)   /* park_wheel.c: a deadline alone */
PARK_KIND(SIGNAL, atap__park_kind_signal) /* sources.c */
PARK_KIND(PATH, atap__park_kind_path)     /* sources.c */
PARK_KIND(WAKE, atap__park_kind_wake)     /* park.c: atap_park_wake */
#ifdef ATAP_FAULT_INJECTION
PARK_KIND(TEST_WORD, atap__park_kind_test_word) /* park_test_word.c: test builds only */
#endif
