"""file_glob_search and grep_search, as llama-server's (`server-tools.cpp`)."""

from __future__ import annotations

import os
import time

from api.tools.builtin.grep_scan import (
    GREP_TIMEOUT_S,
    BadPattern,
    GrepState,
    compile_pattern,
    report,
    scan,
)
from api.tools.glob_match import filter_paths
from api.tools.params import optional, required
from api.tools.paths import OutsideRootError
from api.tools.tool import Json, ServerTool, ToolCall, function, prop
from api.tools.tools_io import FileRefused, ListKind

GLOB_MAX_RESULTS = 100
GLOB_FILTER_TIMEOUT_S = 15.0


class FileGlobSearch(ServerTool):
    name = "file_glob_search"
    display_name = "File search"

    def definition(self) -> Json:
        return function(
            self.name,
            "Recursively search for files matching a glob pattern under a directory. "
            "Automatically skips files ignored by .gitignore (when the directory is inside a git "
            "repo) and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
            "A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. "
            "A pattern containing '/' matches the full relative path; unless already anchored "
            "with \"**/\" or a leading '/', it is automatically prefixed with \"**/\". "
            "Use type=\"dir\" or \"all\" to also list directories; directory entries are "
            "suffixed with '/' in the output. "
            "Note: directory listings do not apply .gitignore filtering.",
            {"path": prop("string", "Base directory to search in"),
             "include": prop("string", "Glob pattern for files to include (e.g. \"*.cpp\" or "
                             "\"src/**/*.cpp\"). Default: **"),
             "exclude": prop("string", "Glob pattern for files to exclude"),
             "type": prop("string", "Entry type to return: \"file\" (default), \"dir\" or "
                          "\"all\""),
             "max_depth": prop("integer", "Maximum depth to descend into subdirectories "
                               "(default: 0 = unlimited; 1 = direct children only)"),
             "limit": prop("integer", f"Maximum number of results to return, capped at "
                           f"{GLOB_MAX_RESULTS} (default {GLOB_MAX_RESULTS})")},
            ["path"])

    async def invoke(self, call: ToolCall) -> Json:
        params = call.params
        path = required(params, "path", str)
        base = call.io.resolve(path)
        include = optional(params, "include", "**")
        exclude = optional(params, "exclude", "")
        type_ = optional(params, "type", "file")
        max_depth = max(0, optional(params, "max_depth", 0))
        limit_req = optional(params, "limit", GLOB_MAX_RESULTS)
        if limit_req < 1:
            return {"error": f"invalid limit: {limit_req} (expected 1 or more)"}
        limit = min(limit_req, GLOB_MAX_RESULTS)
        try:
            kind = ListKind(type_)
        except ValueError:
            return {"error": f"invalid type: {type_} (expected \"file\", \"dir\" or \"all\")"}
        listing = await call.io.list_entries(base, max_depth, kind)
        if listing.err:
            return {"error": f"{listing.err}: {path}"}
        kept, cut = await call.io.offload(filter_paths, [e.rel for e in listing.entries],
                                            include, exclude,
                                            time.monotonic() + GLOB_FILTER_TIMEOUT_S)
        listing.truncated = listing.truncated or cut
        matches = [listing.entries[i] for i in kept]
        shown = matches[:limit]
        text = "".join(f"{e.rel}{'/' if e.is_dir else ''}\n" for e in shown)
        text += f"\n---\nTotal matches: {len(matches)}\n"
        if len(matches) > len(shown):
            text += (f"[{len(shown)} results limit reached ({len(matches)} total matches). "
                     "Refine the glob pattern to narrow the search.]\n")
        if listing.truncated:
            text += "[results truncated: time budget or unreadable directory]\n"
        entries = [{"path": e.rel, "type": "dir" if e.is_dir else "file"} for e in shown]
        return {"plain_text_response": text, "entries": entries, "base": base}


class GrepSearch(ServerTool):
    name = "grep_search"
    display_name = "Grep search"

    def definition(self) -> Json:
        return function(
            self.name,
            "Search for a pattern in files under a path. Returns matching lines with file paths "
            "(and, unless searching a single file, paths relative to the given directory). "
            "Automatically skips files ignored by .gitignore (when the directory is inside a git "
            "repo) and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
            "include/exclude: a pattern with no '/' matches the basename at any depth; a pattern "
            "containing '/' matches the full relative path (auto-anchored with \"**/\" unless "
            "already anchored).",
            {"path": prop("string", "File or directory to search in"),
             "pattern": prop("string", "Pattern to search for (regular expression unless "
                             "literal is true)"),
             "include": prop("string", "Glob pattern to filter files (default: **)"),
             "exclude": prop("string", "Glob pattern to exclude files"),
             "return_line_numbers": prop("boolean", "If true, include line numbers in results"),
             "literal": prop("boolean", "Treat pattern as a literal string instead of a regular "
                             "expression (default: false)"),
             "ignore_case": prop("boolean", "Case-insensitive search (default: false)"),
             "context_lines": prop("integer", "Number of lines of context to show before and "
                                   "after each match (default: 0)")},
            ["path", "pattern"])

    async def invoke(self, call: ToolCall) -> Json:
        params = call.params
        path = required(params, "path", str)
        source = required(params, "pattern", str)
        include = optional(params, "include", "**")
        exclude = optional(params, "exclude", "")
        show_lineno = optional(params, "return_line_numbers", False)
        ctx = max(0, optional(params, "context_lines", 0))
        deadline = time.monotonic() + GREP_TIMEOUT_S
        try:
            pattern = await call.io.offload(compile_pattern, source,
                                              optional(params, "literal", False),
                                              optional(params, "ignore_case", False))
        except BadPattern as exc:
            return {"error": str(exc)}
        io = call.io
        abs_path = io.resolve(path)
        state = GrepState()
        files: list[tuple[str, str]] = []
        if await io.is_regular_file(abs_path):
            files.append((abs_path, path))
        elif await io.is_directory(abs_path):
            listing = await io.list_entries(abs_path, 0, ListKind.FILES)
            if listing.err:
                return {"error": f"{listing.err}: {path}"}
            rels = [e.rel for e in listing.entries]
            kept, state.timed_out = await call.io.offload(filter_paths, rels, include,
                                                            exclude, deadline)
            files = [(os.path.join(abs_path, rels[i]), rels[i]) for i in kept]
        else:
            return {"error": f"path does not exist: {path}"}
        show_num = show_lineno or ctx > 0
        for full, shown in files:
            if state.done:
                break
            try:
                data = await io.read_file(full)
            except (OutsideRootError, FileRefused):  # a link out of the root, a device, a
                data = None  # file over the read bound: not searched
            if data is None:
                continue
            await call.io.offload(scan, pattern, data, shown, ctx, show_num, state, deadline)
        return {"plain_text_response": report(state)}
