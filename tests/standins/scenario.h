/*
 * A small JSON reader for the test stand-ins of libnvidia-ml.so.1 and libcuda.so.1.
 *
 * STAND-IN, test code only: the stand-in libraries read their scenario (which GPUs,
 * which answers, which errors) from a JSON file named by an environment variable.
 * Objects, arrays, strings (no escapes beyond \" and \\), integers, true/false/null.
 */
#ifndef BUILDMATRIX_STANDIN_SCENARIO_H
#define BUILDMATRIX_STANDIN_SCENARIO_H

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jval {
    enum jtype type;
    long long num;
    char *str;           /* J_STR */
    struct jval **items; /* J_ARR values, J_OBJ values */
    char **keys;         /* J_OBJ keys */
    int len;
} jval;

static const char *jp;

static void jskip(void) {
    while (*jp && isspace((unsigned char)*jp)) jp++;
}

static jval *jnew(enum jtype t) {
    jval *v = calloc(1, sizeof *v);
    v->type = t;
    return v;
}

static jval *jparse(void);

static char *jstring(void) {
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    jp++; /* opening quote */
    while (*jp && *jp != '"') {
        char c = *jp++;
        if (c == '\\' && *jp) c = *jp++;
        if (n + 2 > cap) s = realloc(s, cap *= 2);
        s[n++] = c;
    }
    if (*jp == '"') jp++;
    s[n] = 0;
    return s;
}

static void jpush(jval *v, char *key, jval *item) {
    v->items = realloc(v->items, sizeof(jval *) * (v->len + 1));
    v->items[v->len] = item;
    if (v->type == J_OBJ) {
        v->keys = realloc(v->keys, sizeof(char *) * (v->len + 1));
        v->keys[v->len] = key;
    }
    v->len++;
}

static jval *jparse(void) {
    jskip();
    if (*jp == '{' || *jp == '[') {
        int obj = *jp == '{';
        jval *v = jnew(obj ? J_OBJ : J_ARR);
        jp++;
        for (;;) {
            jskip();
            if (*jp == '}' || *jp == ']') { jp++; break; }
            if (*jp == ',') { jp++; continue; }
            if (!*jp) break;
            char *key = NULL;
            if (obj) {
                key = jstring();
                jskip();
                if (*jp == ':') jp++;
            }
            jpush(v, key, jparse());
        }
        return v;
    }
    if (*jp == '"') {
        jval *v = jnew(J_STR);
        v->str = jstring();
        return v;
    }
    if (!strncmp(jp, "true", 4)) { jp += 4; jval *v = jnew(J_BOOL); v->num = 1; return v; }
    if (!strncmp(jp, "false", 5)) { jp += 5; return jnew(J_BOOL); }
    if (!strncmp(jp, "null", 4)) { jp += 4; return jnew(J_NULL); }
    jval *v = jnew(J_NUM);
    v->num = strtoll(jp, (char **)&jp, 10);
    return v;
}

/* Parse the file named by environment variable `var`; NULL when unset or unreadable. */
static jval *scenario_load(const char *var) {
    const char *path = getenv(var);
    if (!path) return NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc(1, size + 1);
    if (fread(text, 1, size, f) != (size_t)size) size = 0;
    fclose(f);
    jp = text;
    return jparse();
}

static jval *jget(const jval *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (int i = 0; i < obj->len; i++)
        if (!strcmp(obj->keys[i], key)) return obj->items[i];
    return NULL;
}

static jval *jat(const jval *arr, int i) {
    if (!arr || arr->type != J_ARR || i < 0 || i >= arr->len) return NULL;
    return arr->items[i];
}

#endif
