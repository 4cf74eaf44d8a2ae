"""``push_to_hub``: upload a saved model (weights, tokenizer, model card, metrics) to the Hugging Face Hub
with ``huggingface_hub``.

``check_hub_access`` runs before training, so that a missing or read-only token, or an unreachable hub,
stops the run at its start rather than after hours of training; ``push_model`` uploads a folder (the final
``output_dir`` or a ``checkpoint-<step>``), leaving out what is not the model: resumable checkpoints and
their optimizer/RNG state, the completion log, local tracker files. A hub error becomes a ``RuntimeError``
naming ``push_to_hub`` and what to do; the saved model stays on disk either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, constants, get_token
from huggingface_hub.errors import HFValidationError, LocalTokenNotFoundError, OfflineModeIsEnabled
from huggingface_hub.utils import validate_repo_id

from grpokit.data.integrity import InputError
from grpokit.data.run_folder import LOCK_FILE, MANIFEST

__all__ = ["HUB_IGNORE_PATTERNS", "HubError", "check_hub_access", "push_model", "resolve_repo_id"]

class HubError(InputError, RuntimeError):
    """The Hub refused or could not be reached (no token, a read-only one, offline, ...): said in one
    sentence with what to do, never a traceback on the command line."""


HUB_IGNORE_PATTERNS = (
    "checkpoint-*",  # resumable checkpoints (optimizer state included) and their .tmp staging folders
    "*.pt",  # a checkpoint's optimizer, scheduler, RNG and extra state (the model is in *.safetensors)
    "trainer_state.json",  # a checkpoint's step and data position
    "deepspeed/*",  # a ZeRO checkpoint's engine files
    "completions.jsonl",  # every sampled completion with its prompt: training data, not the model
    "reward_model/*",  # iterative GRPO's reward model: not the policy
    "wandb/*",  # W&B's local run files
    "config.yaml",  # grpokit train's config dump holds hub_token; the card has the config without it
    MANIFEST,  # the run's record of itself on this machine (process, host): not the model
    LOCK_FILE,  # the folder's lock while a run writes it
    ".model.tmp-*",  # a final save cut off mid-write
)
"""What ``push_model`` leaves out (``huggingface_hub`` glob patterns, matched on paths relative to the
folder; ``*`` also crosses ``/``). Uploaded: the model and tokenizer files, ``README.md`` (the card),
``metrics.jsonl``, ``metrics.png``, ``eval_summary.json`` and TensorBoard events."""

LOGIN_ADVICE = "log in with `hf auth login`, set the HF_TOKEN environment variable, or set hub_token"


def check_hub_access(args: Any, api: Any = None) -> str:
    """Fail early, before training, when ``push_to_hub`` cannot work: no token (``hub_token``, ``HF_TOKEN``
    or the stored login), offline mode, an invalid or read-only token, or no usable repository name. Returns
    the repository id the pushes will go to. ``api``: an ``HfApi``-like object (default one with
    ``hub_token``)."""
    if api is None:
        if constants.is_offline_mode():
            raise HubError(
                "push_to_hub: HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, so nothing can be uploaded; "
                "unset it, or set push_to_hub=false"
            )
        try:
            token = args.hub_token or get_token()
        except Exception as err:  # HF_OIDC_RESOURCE is set and its token exchange failed
            raise _hub_error("get a token for", "the Hugging Face Hub", err) from err
        if not token:
            raise HubError(
                f"push_to_hub: no Hugging Face token was found; {LOGIN_ADVICE} (a token with write access), "
                "or set push_to_hub=false"
            )
        api = HfApi(token=args.hub_token)
    user = _whoami(api, "check the token with")
    role = ((user.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubError(
            "push_to_hub: the Hugging Face token is read-only; use a token with write access "
            f"({LOGIN_ADVICE}), or set push_to_hub=false"
        )
    return resolve_repo_id(args, api, user=user)


def resolve_repo_id(args: Any, api: Any = None, *, user: dict | None = None) -> str:
    """The repository pushes go to: ``hub_model_id`` (``user/name``; a bare name goes under your account),
    else ``<your account>/<output_dir's last component>``. ``user``: a ``whoami()`` answer already
    fetched."""
    name = args.hub_model_id or Path(args.output_dir).resolve().name
    if "/" not in name:
        if user is None:
            user = _whoami(api if api is not None else HfApi(token=args.hub_token), "find your account on")
        name = f"{user['name']}/{name}"
    try:
        validate_repo_id(name)
    except HFValidationError as err:
        raise HubError(
            f"push_to_hub: {name!r} is not a valid repository id ({err}); set hub_model_id=<user>/<name>"
        ) from err
    return name


def push_model(folder: str | Path, args: Any, *, commit_message: str, api: Any = None) -> str:
    """Upload ``folder`` (a saved model: ``output_dir`` or a ``checkpoint-<step>``) to the repository of
    ``resolve_repo_id``, created if needed (private per ``hub_private_repo``), on branch ``hub_revision``
    (created if needed), without the files ``HUB_IGNORE_PATTERNS`` names. Returns the repository's URL.
    ``api``: an ``HfApi``-like object (default: ``HfApi(token=hub_token)``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"push_to_hub: {folder} is not a folder holding a saved model")
    api = api if api is not None else HfApi(token=args.hub_token)
    repo_id = resolve_repo_id(args, api)
    try:
        url = api.create_repo(repo_id, private=args.hub_private_repo, exist_ok=True, repo_type="model")
        repo_id = getattr(url, "repo_id", None) or repo_id
        revision = args.hub_revision
        if revision and not revision.startswith("refs/pr/"):
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            commit_message=commit_message,
            revision=revision,
            ignore_patterns=list(HUB_IGNORE_PATTERNS),  # a fresh list: upload_folder extends it
            repo_type="model",
        )
    except Exception as err:
        raise _hub_error(f"upload {folder} to", repo_id, err, folder) from err
    return str(url)


def _whoami(api: Any, action: str) -> dict:
    try:
        return api.whoami()
    except Exception as err:
        raise _hub_error(action, "the Hugging Face Hub", err) from err


def _network_error(err: Exception) -> bool:
    """Whether ``err`` says the hub was not reached (offline mode, connection, timeout), whichever HTTP
    library raised it."""
    if isinstance(err, (OfflineModeIsEnabled, ConnectionError, TimeoutError)):
        return True
    words = ("Connect", "Timeout", "Transport", "Network")
    return any(word in cls.__name__ for cls in type(err).__mro__ for word in words)


def _hub_error(action: str, target: str, err: Exception, folder: Path | None = None) -> HubError:
    """A hub failure as a HubError that names push_to_hub, the cause and what to do."""
    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(err, LocalTokenNotFoundError) or status == 401:
        advice = f"the Hugging Face token is missing or invalid: {LOGIN_ADVICE}"
    elif status == 403:
        advice = (
            f"the token may not write to {target}: use a token with write access to it, or a hub_model_id "
            "under your own account"
        )
    elif status is None and _network_error(err):
        advice = "the hub could not be reached: check the network connection and HF_HUB_OFFLINE"
    else:
        advice = "the hub's message says why"
    saved = ""
    if folder is not None:
        saved = (
            f"; the model is saved in {folder}: upload it later with grpokit.reporting.hub.push_model (which "
            "leaves out checkpoints, optimizer state and config.yaml)"
        )
    return HubError(
        f"push_to_hub: could not {action} {target} ({type(err).__name__}: {err}); {advice}{saved}, "
        "or set push_to_hub=false"
    )
