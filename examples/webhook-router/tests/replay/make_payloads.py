#!/usr/bin/env python3
"""Writes the replay test's payloads (tests/replay/payloads/*.json): GitHub webhook payloads shaped
as GitHub sends them (the fields GitHub documents for each event, with realistic values), written
for this project. Run it again after editing; the JSON files are committed.

    python3 tests/replay/make_payloads.py
"""
import json
import os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "payloads")
API = "https://api.github.com"
WEB = "https://github.com"


def user(login, uid, kind="User"):
    return {
        "login": login, "id": uid, "node_id": f"MDQ6VXNlcj{uid}", "type": kind,
        "avatar_url": f"https://avatars.githubusercontent.com/u/{uid}?v=4",
        "url": f"{API}/users/{login}", "html_url": f"{WEB}/{login}", "site_admin": False,
    }


def repo(owner, name, rid, private=False):
    full = f"{owner['login']}/{name}"
    return {
        "id": rid, "node_id": f"R_kgDO{rid}", "name": name, "full_name": full, "private": private,
        "owner": owner, "html_url": f"{WEB}/{full}", "url": f"{API}/repos/{full}",
        "fork": False, "default_branch": "main", "visibility": "private" if private else "public",
        "created_at": "2025-03-02T10:11:12Z", "pushed_at": "2026-01-05T08:00:00Z",
    }


ORG = user("Octo-Org", 9919, "Organization")
EMU = user("mona_octocorp", 71001)
MONA = user("mona", 583231)
BOT = user("dependabot[bot]", 49699333, "Bot")
API_REPO = repo(ORG, "api", 1296269)
UPSTREAM = repo(user("upstream-org", 4242, "Organization"), "engine", 7777)
EMU_REPO = repo(EMU, "app", 88001, private=True)
INSTALLATION = {"id": 2311213, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uMjMxMTIxMw=="}


def pr_object(r, number, state="open", merged=False, head_sha="6dcb09b5b57875f334f61aebed695e2e4193db5e"):
    full = r["full_name"]
    return {
        "url": f"{API}/repos/{full}/pulls/{number}", "id": 1000000 + number,
        "node_id": f"PR_kwDO{number}", "html_url": f"{WEB}/{full}/pull/{number}", "number": number,
        "state": state, "locked": False, "title": f"Improve the thing (#{number})", "user": MONA,
        "body": "This changes the thing.\n\n- [x] tests", "draft": False, "merged": merged,
        "created_at": "2026-01-04T12:00:00Z", "updated_at": "2026-01-05T09:30:00Z",
        "closed_at": "2026-01-05T09:30:00Z" if state == "closed" else None,
        "merged_at": "2026-01-05T09:30:00Z" if merged else None,
        "head": {"label": f"{r['owner']['login']}:feature-{number}", "ref": f"feature-{number}",
                 "sha": head_sha, "user": MONA, "repo": r},
        "base": {"label": f"{r['owner']['login']}:main", "ref": "main",
                 "sha": "9049f1265b7d61be4a8904a9a27120d2064dab3b", "user": r["owner"], "repo": r},
        "commits": 3, "additions": 120, "deletions": 14, "changed_files": 5,
    }


def linked_pr(r, number):
    # check_run / check_suite / workflow_run describe their pull requests minimally.
    return {
        "url": f"{API}/repos/{r['full_name']}/pulls/{number}", "id": 1000000 + number, "number": number,
        "head": {"ref": f"feature-{number}", "sha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
                 "repo": {"id": r["id"], "url": r["url"], "name": r["name"]}},
        "base": {"ref": "main", "sha": "f95f852bd8fca8fcc58a9a2d6c842781e32a215e",
                 "repo": {"id": r["id"], "url": r["url"], "name": r["name"]}},
    }


def issue(r, number, on_pr):
    full = r["full_name"]
    out = {
        "url": f"{API}/repos/{full}/issues/{number}", "id": 2000000 + number, "number": number,
        "title": "Spelling in the README" if not on_pr else f"Improve the thing (#{number})",
        "user": MONA, "labels": [{"id": 208045946, "name": "bug", "color": "f29513"}],
        "state": "open", "locked": False, "comments": 2, "created_at": "2026-01-04T12:00:00Z",
        "updated_at": "2026-01-05T09:30:00Z", "author_association": "MEMBER", "body": "Please fix.",
    }
    if on_pr:
        out["pull_request"] = {
            "url": f"{API}/repos/{full}/pulls/{number}", "html_url": f"{WEB}/{full}/pull/{number}",
            "diff_url": f"{WEB}/{full}/pull/{number}.diff", "patch_url": f"{WEB}/{full}/pull/{number}.patch",
            "merged_at": None,
        }
    return out


def base(r, sender=MONA):
    return {"repository": r, "organization": r["owner"] if r["owner"]["type"] == "Organization" else None,
            "sender": sender, "installation": INSTALLATION}


def write(name, payload):
    payload = {k: v for k, v in payload.items() if v is not None}
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    os.makedirs(HERE, exist_ok=True)
    r = API_REPO
    write("pull_request.opened", {"action": "opened", "number": 42, "pull_request": pr_object(r, 42), **base(r)})
    write("pull_request_review.submitted", {
        "action": "submitted", "pull_request": pr_object(r, 42), **base(r, BOT),
        "review": {"id": 80, "user": BOT, "body": "Looks good", "state": "approved",
                   "commit_id": "6dcb09b5b57875f334f61aebed695e2e4193db5e",
                   "submitted_at": "2026-01-05T09:00:00Z", "author_association": "CONTRIBUTOR"}})
    write("pull_request_review_comment.created", {
        "action": "created", "pull_request": pr_object(r, 42), **base(r),
        "comment": {"id": 426, "pull_request_review_id": 80, "diff_hunk": "@@ -1 +1 @@\n-a\n+b",
                    "path": "src/lib.rs", "position": 1, "line": 1, "side": "RIGHT", "user": MONA,
                    "body": "nit: naming", "created_at": "2026-01-05T09:01:00Z"}})
    write("pull_request_review_thread.resolved", {
        "action": "resolved", "pull_request": pr_object(r, 42), **base(r),
        "thread": {"node_id": "PRRT_kwDOAA", "comments": [
            {"id": 426, "path": "src/lib.rs", "body": "nit: naming", "user": MONA}]}})
    write("issue_comment.created.pr", {
        "action": "created", "issue": issue(r, 42, True), **base(r),
        "comment": {"id": 1000, "user": MONA, "body": "/retest", "created_at": "2026-01-05T09:02:00Z",
                    "author_association": "MEMBER"}})
    write("issue_comment.created.issue", {
        "action": "created", "issue": issue(r, 7, False), **base(r),
        "comment": {"id": 1001, "user": MONA, "body": "+1", "created_at": "2026-01-05T09:03:00Z"}})
    write("issues.labeled.pr42", {"action": "labeled", "issue": issue(r, 42, True),
                                  "label": {"id": 1, "name": "ready", "color": "0e8a16"}, **base(r)})
    write("issues.labeled.pr43", {"action": "labeled", "issue": issue(r, 43, True),
                                  "label": {"id": 1, "name": "ready", "color": "0e8a16"}, **base(r)})
    write("check_run.completed", {
        "action": "completed", **base(r),
        "check_run": {"id": 128620228, "name": "build", "head_sha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
                      "status": "completed", "conclusion": "success", "started_at": "2026-01-05T09:10:00Z",
                      "completed_at": "2026-01-05T09:14:00Z",
                      "app": {"id": 15368, "slug": "github-actions", "name": "GitHub Actions"},
                      "check_suite": {"id": 118578147, "head_branch": "feature-42"},
                      "pull_requests": [linked_pr(r, 42), linked_pr(r, 44)]}})
    write("check_suite.requested", {
        "action": "requested", **base(r),
        "check_suite": {"id": 118578147, "head_branch": "feature-42", "status": "queued",
                        "head_sha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
                        "app": {"id": 15368, "slug": "github-actions"},
                        "pull_requests": [linked_pr(r, 42)]}})
    write("workflow_run.completed.push", {
        "action": "completed", **base(r),
        "workflow": {"id": 161335, "name": "CI", "path": ".github/workflows/ci.yml"},
        "workflow_run": {"id": 30433642, "name": "CI", "event": "push", "head_branch": "main",
                         "status": "completed", "conclusion": "success", "run_number": 562,
                         "pull_requests": []}})
    # A fork's pull request: the run happens in the fork (the delivery's repository), the pull
    # request lives upstream, named by its base repository.
    fork = repo(user("contributor", 3141), "engine", 9001)
    write("workflow_run.completed.fork", {
        "action": "completed", **base(fork),
        "workflow": {"id": 161336, "name": "CI", "path": ".github/workflows/ci.yml"},
        "workflow_run": {"id": 30433643, "name": "CI", "event": "pull_request", "head_branch": "fix",
                         "status": "completed", "conclusion": "failure", "run_number": 17,
                         "pull_requests": [{"url": f"{API}/repos/upstream-org/engine/pulls/12", "id": 1000012,
                                            "number": 12,
                                            "head": {"ref": "fix", "sha": "aa" * 20,
                                                     "repo": {"id": fork["id"], "url": fork["url"], "name": "engine"}},
                                            "base": {"ref": "main", "sha": "bb" * 20,
                                                     "repo": {"id": UPSTREAM["id"], "url": UPSTREAM["url"], "name": "engine"}}}]}})
    write("workflow_run.completed.emu", {
        "action": "completed", **base(EMU_REPO, EMU),
        "workflow": {"id": 1, "name": "CI", "path": ".github/workflows/ci.yml"},
        "workflow_run": {"id": 99, "name": "CI", "event": "pull_request", "head_branch": "feature-45",
                         "status": "completed", "conclusion": "success", "run_number": 3,
                         "pull_requests": [linked_pr(EMU_REPO, 45)]}})
    write("merge_group.checks_requested", {
        "action": "checks_requested", **base(r),
        "merge_group": {"head_sha": "cc" * 20,
                        "head_ref": "refs/heads/gh-readonly-queue/main/pr-46-" + "dd" * 20,
                        "base_sha": "ee" * 20, "base_ref": "refs/heads/main",
                        "head_commit": {"id": "cc" * 20, "message": "Merge pull request #46"}}})
    write("pull_request.closed.merged", {"action": "closed", "number": 44,
                                         "pull_request": pr_object(r, 44, "closed", True), **base(r)})
    write("pull_request.closed.unmerged", {"action": "closed", "number": 47,
                                           "pull_request": pr_object(r, 47, "closed", False), **base(r)})
    write("pull_request.labeled", {"action": "labeled", "number": 48, "pull_request": pr_object(r, 48),
                                   "label": {"id": 1, "name": "ready"}, **base(r)})
    write("push", {"ref": "refs/heads/main", "before": "0" * 40, "after": "ff" * 20, **base(r),
                   "pusher": {"name": "mona", "email": "mona@example.com"}, "commits": [], "forced": False})
    write("ping", {"zen": "Design for failure.", "hook_id": 109948940,
                   "hook": {"type": "Repository", "id": 109948940, "events": ["*"], "active": True,
                            "config": {"content_type": "json", "insecure_ssl": "0", "url": "https://example.com/webhook"}},
                   "repository": r, "sender": MONA})


if __name__ == "__main__":
    main()
