/* A bounded LIFO of free blocks for reuse, linked through their first word
 * (a block's contents are undefined while it is on the list). One owner, no
 * lock: a per-thread list (_Thread_local, with base_freelist_free_at_exit)
 * or one per object touched by one thread. It saves a malloc/free pair per
 * message where the blocks are above malloc's per-thread caches or aligned.
 *
 *     static _Thread_local base_freelist_t cache = {.max = 64};
 *     void *p = base_freelist_pop(&cache);           NULL: allocate one
 *     if (!base_freelist_push(&cache, p)) free(p);   full: give it back
 */
#ifndef BT_BASE_FREELIST_H
#define BT_BASE_FREELIST_H

#include <stdbool.h>
#include <string.h>

typedef struct base_freelist {
    void                 *head;
    unsigned              n, max;
    bool                  at_exit;  /* base_freelist_free_at_exit registered it */
    struct base_freelist *exit_next;
} base_freelist_t;

static inline void *base_freelist_pop(base_freelist_t *f)
{
    void *p = f->head;
    if (p) {
        memcpy(&f->head, p, sizeof f->head);
        f->n--;
    }
    return p;
}

/* False when the list holds max blocks already: the caller frees p. */
static inline bool base_freelist_push(base_freelist_t *f, void *p)
{
    if (f->n >= f->max) return false;
    memcpy(p, &f->head, sizeof f->head);
    f->head = p;
    f->n++;
    return true;
}

/* free() every block on the list. */
void base_freelist_drain(base_freelist_t *f);

/* For a _Thread_local list: drain it when the calling thread exits. Cheap
 * to call again (once per thread it registers). */
void base_freelist_free_at_exit(base_freelist_t *f);

#endif
