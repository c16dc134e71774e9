/* SPDX-License-Identifier: MIT */
/*  golden_manifest.c: manifest parsing for the golden-case checker. */
#include "tools/golden_manifest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/idx.h>

static int parse_rows(const char *spec, golden_entry_t *e, const char *where)
{
    /* spec points after "[rows=" and ends with "]" */
    const char *p = spec;
    while (*p && *p != ']') {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0)
            return zd_error_set("%s: bad row list \"%s\"", where, spec);
        if (e->n_rows == GOLDEN_MAX_ROWS)
            return zd_error_set("%s: more than %d rows", where, GOLDEN_MAX_ROWS);
        e->rows[e->n_rows++] = v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p != ']')
            return zd_error_set("%s: bad row list \"%s\"", where, spec);
    }
    if (*p != ']' || p[1] != '\0')
        return zd_error_set("%s: row list not closed by ']'", where);
    return 0;
}

static int parse_attrs(golden_case_t *c, char *line, const char *where)
{
    for (char *tok = strtok(line, " \t"); tok; tok = strtok(NULL, " \t")) {
        char *eq = strchr(tok, '=');
        if (!eq)
            return zd_error_set("%s: attribute \"%s\" is not key=value", where, tok);
        if (c->n_attrs == GOLDEN_MAX_ATTRS)
            return zd_error_set("%s: too many attributes", where);
        *eq = '\0';
        snprintf(c->attr_key[c->n_attrs], sizeof c->attr_key[0], "%s", tok);
        snprintf(c->attr_val[c->n_attrs], sizeof c->attr_val[0], "%s", eq + 1);
        c->n_attrs++;
    }
    return 0;
}

static int parse_entry(golden_case_t *c, char *line, const char *where)
{
    char role[32], name[256], file[512], extra[8];
    if (sscanf(line, "%31s %255s %511s %7s", role, name, file, extra) != 3)
        return zd_error_set("%s: expected \"role name file\"", where);
    if (strcmp(role, "input") && strcmp(role, "param") && strcmp(role, "output") &&
        strcmp(role, "grad"))
        return zd_error_set("%s: unknown role \"%s\"", where, role);
    if (c->n == GOLDEN_MAX_ENTRIES)
        return zd_error_set("%s: more than %d tensors", where, GOLDEN_MAX_ENTRIES);
    golden_entry_t *e = &c->entries[c->n];
    memset(e, 0, sizeof *e);
    snprintf(e->role, sizeof e->role, "%s", role);
    char *bracket = strchr(name, '[');
    if (bracket) {
        if (strncmp(bracket, "[rows=", 6) != 0)
            return zd_error_set("%s: unknown name suffix \"%s\"", where, bracket);
        if (parse_rows(bracket + 6, e, where) < 0)
            return -1;
        *bracket = '\0';
    }
    if (strlen(name) >= sizeof e->name)
        return zd_error_set("%s: name too long", where);
    strcpy(e->name, name);
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", c->dir, file);
    if (!(e->value = zd_idx_read(path)))
        return zd_error_wrap("%s", where);
    c->n++;
    return 0;
}

golden_case_t *golden_case_load(const char *dir)
{
    golden_case_t *c = calloc(1, sizeof *c);
    if (!c) {
        zd_error_set("golden: out of memory");
        return NULL;
    }
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    char path[1100];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        zd_error_set("golden: cannot open %s: %s", path, strerror(errno));
        free(c);
        return NULL;
    }
    char line[4096];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        char where[1200];
        snprintf(where, sizeof where, "golden: %s line %d", path, lineno);
        line[strcspn(line, "\r\n")] = '\0';
        if (strncmp(line, "# kind:", 7) == 0) {
            if (sscanf(line + 7, "%63s", c->kind) != 1)
                rc = zd_error_set("%s: empty kind", where);
        } else if (strncmp(line, "# attrs:", 8) == 0) {
            rc = parse_attrs(c, line + 8, where);
        } else if (line[0] != '#' && line[0] != '\0') {
            rc = parse_entry(c, line, where);
        }
    }
    fclose(f);
    if (rc == 0 && !c->kind[0])
        rc = zd_error_set("golden: %s has no \"# kind:\" line", path);
    if (rc < 0) {
        golden_case_free(c);
        return NULL;
    }
    return c;
}

void golden_case_free(golden_case_t *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        zd_tensor_unref(c->entries[i].value);
    free(c);
}

golden_entry_t *golden_find(golden_case_t *c, const char *role, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->entries[i].role, role) && !strcmp(c->entries[i].name, name))
            return &c->entries[i];
    return NULL;
}

zd_tensor_t *golden_tensor(golden_case_t *c, const char *role, const char *name)
{
    golden_entry_t *e = golden_find(c, role, name);
    return e ? e->value : NULL;
}

double golden_attr(const golden_case_t *c, const char *key, double fallback)
{
    for (int i = 0; i < c->n_attrs; i++)
        if (!strcmp(c->attr_key[i], key))
            return strtod(c->attr_val[i], NULL);
    return fallback;
}
