/* freetree.c - AVL tree of free extents keyed by (size, address).
 *
 * Insertion and removal retrace from the changed node to the root, updating
 * heights and rotating where a subtree leans by two: O(log n) with n the
 * number of free extents, a few hundred in the traces of real training jobs.
 */
#include "freetree.h"

static int height(const cuh_ftnode_t *n) { return n ? n->height : 0; }

static void update_height(cuh_ftnode_t *n)
{
    int l = height(n->left), r = height(n->right);
    n->height = (l > r ? l : r) + 1;
}

static int key_less(const cuh_ftnode_t *a, const cuh_ftnode_t *b)
{
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

static void replace_child(cuh_freetree_t *t, cuh_ftnode_t *parent, cuh_ftnode_t *old, cuh_ftnode_t *new_child)
{
    if (!parent)
        t->root = new_child;
    else if (parent->left == old)
        parent->left = new_child;
    else
        parent->right = new_child;
    if (new_child)
        new_child->parent = parent;
}

static cuh_ftnode_t *rotate_left(cuh_freetree_t *t, cuh_ftnode_t *x)
{
    cuh_ftnode_t *y = x->right;
    x->right = y->left;
    if (y->left)
        y->left->parent = x;
    replace_child(t, x->parent, x, y);
    y->left = x;
    x->parent = y;
    update_height(x);
    update_height(y);
    return y;
}

static cuh_ftnode_t *rotate_right(cuh_freetree_t *t, cuh_ftnode_t *x)
{
    cuh_ftnode_t *y = x->left;
    x->left = y->right;
    if (y->right)
        y->right->parent = x;
    replace_child(t, x->parent, x, y);
    y->right = x;
    x->parent = y;
    update_height(x);
    update_height(y);
    return y;
}

/* Walks up from n restoring heights and balance; stops at the first subtree
 * whose height came out as it was before the change, since nothing above it
 * can have changed. */
static void rebalance_up(cuh_freetree_t *t, cuh_ftnode_t *n)
{
    while (n) {
        int before = n->height;
        update_height(n);
        int balance = height(n->left) - height(n->right);
        if (balance > 1) {
            if (height(n->left->left) < height(n->left->right))
                rotate_left(t, n->left);
            n = rotate_right(t, n);
        } else if (balance < -1) {
            if (height(n->right->right) < height(n->right->left))
                rotate_right(t, n->right);
            n = rotate_left(t, n);
        }
        if (n->height == before)
            break;
        n = n->parent;
    }
}

void cuh_freetree_insert(cuh_freetree_t *t, cuh_ftnode_t *node, size_t size, uintptr_t addr)
{
    node->size = size;
    node->addr = addr;
    node->left = node->right = NULL;
    node->height = 1;
    cuh_ftnode_t *parent = NULL, **link = &t->root;
    while (*link) {
        parent = *link;
        link = key_less(node, parent) ? &parent->left : &parent->right;
    }
    *link = node;
    node->parent = parent;
    t->count++;
    t->bytes += size;
    rebalance_up(t, parent);
}

static cuh_ftnode_t *leftmost(cuh_ftnode_t *n)
{
    while (n && n->left)
        n = n->left;
    return n;
}

void cuh_freetree_remove(cuh_freetree_t *t, cuh_ftnode_t *z)
{
    cuh_ftnode_t *start;
    if (!z->left || !z->right) {
        cuh_ftnode_t *child = z->left ? z->left : z->right;
        start = z->parent;
        replace_child(t, z->parent, z, child);
    } else {
        cuh_ftnode_t *y = leftmost(z->right);
        if (y->parent != z) {
            start = y->parent;
            replace_child(t, y->parent, y, y->right);
            y->right = z->right;
            y->right->parent = y;
        } else {
            start = y;
        }
        replace_child(t, z->parent, z, y);
        y->left = z->left;
        y->left->parent = y;
        /* y now stands where z stood: the height the retrace compares
         * against is z's. */
        y->height = z->height;
    }
    z->left = z->right = z->parent = NULL;
    t->count--;
    t->bytes -= z->size;
    rebalance_up(t, start);
}

cuh_ftnode_t *cuh_freetree_lower_bound(const cuh_freetree_t *t, size_t size)
{
    cuh_ftnode_t *n = t->root, *best = NULL;
    while (n) {
        if (n->size >= size) {
            best = n;
            n = n->left;
        } else {
            n = n->right;
        }
    }
    return best;
}

cuh_ftnode_t *cuh_freetree_next(const cuh_ftnode_t *n)
{
    if (n->right)
        return leftmost(n->right);
    const cuh_ftnode_t *p = n->parent;
    while (p && p->right == n) {
        n = p;
        p = p->parent;
    }
    return (cuh_ftnode_t *)p;
}

cuh_ftnode_t *cuh_freetree_first(const cuh_freetree_t *t) { return leftmost(t->root); }

cuh_ftnode_t *cuh_freetree_last(const cuh_freetree_t *t)
{
    cuh_ftnode_t *n = t->root;
    while (n && n->right)
        n = n->right;
    return n;
}

static int check_node(const cuh_ftnode_t *n, const cuh_ftnode_t *parent, size_t *count, size_t *bytes)
{
    if (!n)
        return 0;
    if (n->parent != parent)
        return -1;
    if (n->left && !key_less(n->left, n))
        return -1;
    if (n->right && !key_less(n, n->right))
        return -1;
    if (check_node(n->left, n, count, bytes) || check_node(n->right, n, count, bytes))
        return -1;
    int l = height(n->left), r = height(n->right);
    if (n->height != (l > r ? l : r) + 1 || l - r > 1 || r - l > 1)
        return -1;
    (*count)++;
    *bytes += n->size;
    return 0;
}

int cuh_freetree_check(const cuh_freetree_t *t)
{
    size_t count = 0, bytes = 0;
    if (check_node(t->root, NULL, &count, &bytes))
        return -1;
    /* In-order walk must be strictly increasing (covers cross-subtree order). */
    const cuh_ftnode_t *prev = NULL;
    for (const cuh_ftnode_t *n = cuh_freetree_first(t); n; n = cuh_freetree_next(n)) {
        if (prev && !key_less(prev, n))
            return -1;
        prev = n;
    }
    return (count == t->count && bytes == t->bytes) ? 0 : -1;
}
