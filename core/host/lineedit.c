/*
 * lineedit.c: reading REPL input, with libedit line editing and a history
 * file on a terminal and plain reads otherwise.
 *
 * libedit is used through its readline-compatible API, with three changes:
 *   - keys are read by our own function, so that Ctrl-C ends the read at once
 *     (libedit retries an interrupted read, which would leave the prompt
 *     waiting for another key) and the line is dropped;
 *   - that function decodes UTF-8 itself, because libedit takes the int it
 *     returns as one wide character;
 *   - Tab completes through a function the host sets (the REPL completes
 *     Lua names: fields, methods), never file names; words break at
 *     operators, brackets and blanks but not at '.' or ':', so the word
 *     completed is a whole access path like `model.layers.0.ml`.
 * The history is $HOME/.fsdp_lua_history, loaded on the first terminal read
 * and written at exit (os.exit included), capped at HISTORY_MAX entries.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "host.h"

#include <errno.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <editline/readline.h>

enum { HISTORY_MAX = 1000 };

static bool editor_ready;
static char *last_history_line;  /* to skip immediate repeats */
static char history_path[4096];
/* Set by the prompt's SIGINT handler; read after the interrupted read. */
static volatile sig_atomic_t prompt_interrupted;
static host_completer completer;
static void *completer_data;

/* Characters that end a word for completion: Lua's operators, brackets,
 * quotes and blanks, but not '.', ':' and '_', which are part of a path. */
static const char word_breaks[] = " \t\n\"'`@$><=;|&{}()[],+-*/%^#~";

const char *host_history_file(void) {
    const char *home = getenv("HOME");
    if (home == NULL || home[0] == '\0') return NULL;
    int n = snprintf(history_path, sizeof history_path, "%s/.fsdp_lua_history",
                     home);
    if (n < 0 || (size_t)n >= sizeof history_path) return NULL;
    return history_path;
}

/* atexit: write the history; silently nothing when HOME is unwritable. */
static void save_history(void) {
    const char *file = host_history_file();
    if (file == NULL) return;
    /* History can hold secrets typed at the prompt: keep it private. */
    if (write_history(file) == 0) chmod(file, 0600);
}

/* One byte from fd; -1 at end of input, on error, or after Ctrl-C. */
static int read_byte(int fd) {
    unsigned char c;
    for (;;) {
        ssize_t n = read(fd, &c, 1);
        if (n == 1) return c;
        if (n < 0 && errno == EINTR && !prompt_interrupted) continue;
        return -1;
    }
}

/* libedit's key reader: one character, UTF-8 decoded to its code point. A
 * malformed sequence gives U+FFFD rather than stray bytes. */
static int read_key(FILE *stream) {
    int fd = fileno(stream);
    int c = read_byte(fd);
    if (c < 0x80) return c;
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (extra == 0) return 0xFFFD;
    int code = c & (0x3F >> extra);
    for (int i = 0; i < extra; i++) {
        int b = read_byte(fd);
        if (b < 0) return -1;
        if ((b & 0xC0) != 0x80) return 0xFFFD;
        code = (code << 6) | (b & 0x3F);
    }
    return code;
}

void host_set_completer(host_completer fn, void *data) {
    completer = fn;
    completer_data = data;
}

/* The longest common prefix of the candidates, malloc'd. */
/* The longest common prefix of the candidates, malloc'd; `text` itself
 * when that prefix is shorter: candidates may respell the word
 * (`layers.` offers `layers.append` and `layers["0"]`), and Tab must never
 * delete what was typed. */
static char *common_prefix(char **items, size_t n, const char *text) {
    size_t len = strlen(items[0]);
    for (size_t i = 1; i < n; i++) {
        size_t k = 0;
        while (k < len && items[i][k] == items[0][k]) k++;
        len = k;
    }
    if (len < strlen(text)) return strdup(text);
    return strndup(items[0], len);
}

/* libedit's completion entry: the candidates for `text`, the word before
 * the cursor, in readline's form (the replacement first, then the
 * candidates when there are several; NULL for none). The line up to the
 * cursor goes to the completer too, for the context of the word. */
static char **attempt_completion(const char *text, int start, int end) {
    (void)start;
    (void)end;
    rl_attempted_completion_over = 1;  /* never fall back to file names */
    if (completer == NULL) return NULL;
    char *before = strndup(rl_line_buffer, (size_t)rl_point);
    if (before == NULL) return NULL;
    char **items = completer(completer_data, before, text);
    free(before);
    if (items == NULL) return NULL;
    size_t n = 0;
    while (items[n] != NULL) n++;
    if (n == 0) {
        free(items);
        return NULL;
    }
    char **matches = calloc(n + 2, sizeof *matches);
    char *prefix = n > 1 ? common_prefix(items, n, text) : NULL;
    if (matches == NULL || (n > 1 && prefix == NULL)) {
        for (size_t i = 0; i < n; i++) free(items[i]);
        free(items);
        free(matches);
        free(prefix);
        return NULL;
    }
    if (n == 1) {
        matches[0] = items[0];
    } else {
        matches[0] = prefix;
        memcpy(matches + 1, items, n * sizeof *items);
    }
    free(items);
    return matches;
}

static void init_editor(void) {
    if (editor_ready) return;
    editor_ready = true;
    /* libedit converts between wide and multibyte characters with the
     * locale's encoding; only LC_CTYPE changes, so number formatting and
     * parsing in Lua keep the C locale. */
    setlocale(LC_CTYPE, "");
    rl_readline_name = HOST_PROGNAME;
    rl_catch_signals = 0;
    rl_getc_function = read_key;
    rl_attempted_completion_function = attempt_completion;
    rl_basic_word_break_characters = word_breaks;
    rl_completer_word_break_characters = (char *)word_breaks;
    rl_completion_append_character = '\0';
    using_history();
    stifle_history(HISTORY_MAX);
    const char *file = host_history_file();
    if (file != NULL) read_history(file);
    atexit(save_history);
}

static void on_prompt_sigint(int sig) {
    (void)sig;
    prompt_interrupted = 1;
}

/* While waiting at the prompt Ctrl-C only cancels the line: no SA_RESTART,
 * so the blocked read returns EINTR. */
static void catch_prompt_sigint(struct sigaction *old) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_prompt_sigint;
    sigemptyset(&action.sa_mask);
    prompt_interrupted = 0;
    sigaction(SIGINT, &action, old);
}

static void release_prompt_sigint(const struct sigaction *old) {
    sigaction(SIGINT, old, NULL);
    host_interrupt_rearm();
}

static host_read_status read_edited(const char *prompt, char **line) {
    init_editor();
    struct sigaction old;
    catch_prompt_sigint(&old);
    char *text = readline(prompt);
    release_prompt_sigint(&old);
    if (prompt_interrupted) {
        free(text);
        fputs("\n", stdout);
        fflush(stdout);
        return HOST_READ_INTERRUPTED;
    }
    if (text == NULL) return HOST_READ_EOF;
    *line = text;
    return HOST_READ_LINE;
}

/* Without line editing: a prompt only when a person types (stdin is a
 * terminal), so piped input (`echo 'x' | fsdp-lua -i s.lua`) prints only the
 * values. */
static host_read_status read_plain(const char *prompt, char **line) {
    bool terminal = isatty(STDIN_FILENO);
    struct sigaction old;
    if (terminal) {
        fputs(prompt, stdout);
        fflush(stdout);
        catch_prompt_sigint(&old);
    }
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n = getline(&buf, &cap, stdin);
    if (terminal) release_prompt_sigint(&old);
    if (terminal && prompt_interrupted) {
        clearerr(stdin);
        free(buf);
        fputs("\n", stdout);
        fflush(stdout);
        return HOST_READ_INTERRUPTED;
    }
    if (n < 0) {
        free(buf);
        return HOST_READ_EOF;
    }
    if (n > 0 && buf[n - 1] == '\n') buf[n - 1] = '\0';
    *line = buf;
    return HOST_READ_LINE;
}

host_read_status host_read_line(const char *prompt, char **line) {
    *line = NULL;
    if (isatty(STDIN_FILENO) && isatty(STDOUT_FILENO)) {
        return read_edited(prompt, line);
    }
    return read_plain(prompt, line);
}

static bool is_blank(const char *s) {
    return s[strspn(s, " \t\r\n")] == '\0';
}

void host_add_history(const char *line) {
    /* Only the terminal line editor has a history to recall. */
    if (!(isatty(STDIN_FILENO) && isatty(STDOUT_FILENO))) return;
    if (is_blank(line)) return;
    if (last_history_line != NULL && strcmp(last_history_line, line) == 0) {
        return;
    }
    init_editor();
    add_history(line);
    free(last_history_line);
    last_history_line = strdup(line);
}
