/* The one rule for "Authorization: Bearer <token>" wherever a daemon checks a token (the
 * gateway's admin API and API keys, the agent's front, the sim), as docs/security.md
 * states it: the scheme in any case (RFC 7235), one or more spaces, a non-empty token. */
#ifndef PR_BEARER_H
#define PR_BEARER_H

/* The token in an Authorization header's value: what follows "Bearer" (matched in any
 * case) and one or more spaces, to the end of the value (the HTTP layer has already cut
 * the whitespace around it). NULL when the value is NULL, names another scheme, or
 * carries no token. */
const char *pr_bearer_token(const char *authorization);

/* 0 when the Authorization value `authorization` carries `want` as its bearer token;
 * PR_EMISSING when it carries no bearer token at all; -EACCES when it carries another
 * token, or when want is NULL or empty (then no token is right). Both tokens are hashed
 * with SHA-256 before a constant-time comparison, so the time taken tells nothing of
 * the expected token's length or of how much of it a guess got right. */
int pr_bearer_check(const char *authorization, const char *want);

#endif
