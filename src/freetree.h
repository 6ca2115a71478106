/* freetree.h - an index of free extents ordered by (size, address).
 *
 * Best fit is the question the arena asks most: "the smallest free extent of
 * at least n bytes, lowest address first among equals". An AVL tree keyed by
 * (size, address) answers it in O(log n) with lower_bound, and its in-order
 * walk serves aligned requests that the first candidate cannot hold. The tree
 * is intrusive (the node lives inside the extent) so it never allocates, and
 * nodes keep a parent pointer so that removal and iteration need no stack.
 */
#ifndef CUH_FREETREE_H
#define CUH_FREETREE_H

#include <stddef.h>
#include <stdint.h>

typedef struct cuh_ftnode_s {
    struct cuh_ftnode_s *left, *right, *parent;
    size_t size;       /* key, part 1 */
    uintptr_t addr;    /* key, part 2 */
    int height;
} cuh_ftnode_t;

typedef struct cuh_freetree_s {
    cuh_ftnode_t *root;
    size_t count;
    size_t bytes;      /* sum of the sizes of the nodes */
} cuh_freetree_t;

void cuh_freetree_insert(cuh_freetree_t *tree, cuh_ftnode_t *node, size_t size, uintptr_t addr);
void cuh_freetree_remove(cuh_freetree_t *tree, cuh_ftnode_t *node);
/* The first node in (size, addr) order whose size is >= size, or NULL. */
cuh_ftnode_t *cuh_freetree_lower_bound(const cuh_freetree_t *tree, size_t size);
cuh_ftnode_t *cuh_freetree_next(const cuh_ftnode_t *node);
cuh_ftnode_t *cuh_freetree_first(const cuh_freetree_t *tree);
cuh_ftnode_t *cuh_freetree_last(const cuh_freetree_t *tree);
/* Checks order, balance, parent links, count and bytes; 0 if sound. */
int cuh_freetree_check(const cuh_freetree_t *tree);

#endif /* CUH_FREETREE_H */
