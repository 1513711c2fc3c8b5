/* base/freelist.h: draining, and one pthread key whose destructor drains
 * every thread-local list a thread registered. */
#include "base/freelist.h"

#include <pthread.h>
#include <stdlib.h>

#include "base/log.h"

void base_freelist_drain(base_freelist_t *f)
{
    void *p;
    while ((p = base_freelist_pop(f))) free(p);
}

static pthread_key_t  freelist_key;
static pthread_once_t freelist_once = PTHREAD_ONCE_INIT;

static void freelist_thread_exit(void *arg)
{
    for (base_freelist_t *f = arg, *next; f; f = next) {
        next = f->exit_next;
        base_freelist_drain(f);
        f->at_exit = false;
        f->exit_next = NULL;
    }
}

static void freelist_key_init(void)
{
    if (pthread_key_create(&freelist_key, freelist_thread_exit) != 0)
        BT_PANIC("pthread_key_create failed for the free lists");
}

void base_freelist_free_at_exit(base_freelist_t *f)
{
    if (f->at_exit) return;
    pthread_once(&freelist_once, freelist_key_init);
    f->exit_next = pthread_getspecific(freelist_key);
    pthread_setspecific(freelist_key, f);
    f->at_exit = true;
}
