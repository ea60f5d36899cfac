"""Where other apps keep their GGUF files, on Linux, macOS and Windows, as ``LibraryRoot``s of three layouts:
a plain tree of .gguf files (LM Studio, GPT4All, Jan, folders the user adds), the Hugging Face hub cache
(snapshots whose files are symlinks into ``blobs/``), or Ollama's store (JSON manifests naming extension-less
blobs). Each folder is looked up where that app documents it, not guessed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.llama.bundled import default_model_path
from engine.llama.problems import ModelFileError

# Where each app's folders come from (looked up, not guessed):
SOURCE_LM_STUDIO = "LM Studio"
SOURCE_HF = "Hugging Face"
SOURCE_GPT4ALL = "GPT4All"
SOURCE_JAN = "Jan"
SOURCE_OLLAMA = "Ollama"
SOURCE_USER = "Added folder"
SOURCE_BUNDLED = "Bundled"
KIND_TREE = "tree"  # walk for *.gguf
KIND_HF = "hf"  # the Hugging Face hub cache: models--org--repo/snapshots/<rev>/...
KIND_OLLAMA = "ollama"  # manifests/<host>/<namespace>/<model>/<tag> naming blobs/sha256-<hex>
KIND_FILE = "file"  # one file (the bundled model)


@dataclass(frozen=True)
class LibraryRoot:
    """One folder to scan, the app it belongs to, and its layout (``KIND_*``)."""

    path: str
    source: str
    kind: str = KIND_TREE


def _platform(platform: str | None) -> str:
    name = platform or sys.platform
    if name.startswith("win"):
        return "windows"
    return "macos" if name == "darwin" else "linux"


def _home(env: Mapping[str, str], os_name: str) -> Path:
    home = env.get("USERPROFILE") if os_name == "windows" else env.get("HOME")
    return Path(home) if home else Path.home()


def _env_dir(env: Mapping[str, str], name: str, default: Path) -> Path:
    """An XDG-style variable: used when set to an absolute path, otherwise the default."""
    value = env.get(name, "")
    return Path(value) if value and os.path.isabs(value) else default


def known_roots(env: Mapping[str, str] | None = None, platform: str | None = None) -> list[LibraryRoot]:
    """The folders where LM Studio, the Hugging Face hub, GPT4All, Jan and Ollama keep models on this OS.

    Read from ``env`` (default: the process environment) the way each app reads it: HOME
    (USERPROFILE on Windows), XDG_DATA_HOME / XDG_CONFIG_HOME / XDG_CACHE_HOME on Linux,
    HF_HUB_CACHE / HF_HOME, LOCALAPPDATA / APPDATA on Windows, OLLAMA_MODELS.
    """
    env = os.environ if env is None else env
    os_name = _platform(platform)
    home = _home(env, os_name)
    roots = [
        *_lm_studio(home),
        *_hugging_face(env, home),
        *_gpt4all_and_jan(env, home, os_name),
        *_ollama(env, home, os_name),
    ]
    return list(dict.fromkeys(roots))  # each once, where it first came


def _lm_studio(home: Path) -> list[LibraryRoot]:
    # ~/.lmstudio/models/<publisher>/<model>/<file>.gguf on every OS (Windows: %USERPROFILE%),
    # https://lmstudio.ai/docs/app/basics/import-model ("LM Studio's expected models directory structure");
    # releases before 0.3 kept them in ~/.cache/lm-studio/models (the tree in
    # https://github.com/lmstudio-ai/lmstudio-bug-tracker/issues/230, and C:\Users\<name>\.cache\lm-studio\models
    # on Windows in https://github.com/apache/cloudstack/issues/9075).
    return [LibraryRoot(str(home / ".lmstudio" / "models"), SOURCE_LM_STUDIO),
            LibraryRoot(str(home / ".cache" / "lm-studio" / "models"), SOURCE_LM_STUDIO)]


def _hugging_face(env: Mapping[str, str], home: Path) -> list[LibraryRoot]:
    # $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub ($XDG_CACHE_HOME when set),
    # https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables;
    # layout (models--org--repo/snapshots/<rev>/ symlinks into blobs/) in
    # https://huggingface.co/docs/huggingface_hub/guides/manage-cache. HUGGINGFACE_HUB_CACHE is the older name
    # (https://huggingface.co/docs/huggingface_hub/v0.13.2/guides/manage-cache).
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if hub:
        return [LibraryRoot(str(Path(hub)), SOURCE_HF, KIND_HF)]
    hf_home = env.get("HF_HOME")
    cache = _env_dir(env, "XDG_CACHE_HOME", home / ".cache")
    return [LibraryRoot(str((Path(hf_home) if hf_home else cache / "huggingface") / "hub"), SOURCE_HF, KIND_HF)]


def _gpt4all_and_jan(env: Mapping[str, str], home: Path, os_name: str) -> list[LibraryRoot]:
    # GPT4All downloads into QStandardPaths::AppLocalDataLocation (gpt4all-chat/src/mysettings.cpp,
    # defaultLocalModelsPath) of organization "nomic.ai", application "GPT4All" (gpt4all-chat/src/main.cpp);
    # that location per OS is Qt's table in https://doc.qt.io/qt-6/qstandardpaths.html (the macOS one is
    # also what Homebrew's cask removes: https://github.com/Homebrew/homebrew-cask/blob/HEAD/Casks/g/gpt4all.rb).
    # Jan keeps models in <data folder>/llamacpp/models/<id>/ (janhq/jan extensions/llamacpp-extension/src/index.ts);
    # the default data folder is dirs::data_dir()/Jan/data (janhq/jan src-tauri/src/core/app/commands.rs,
    # default_data_folder_path); Jan's docs give ~/.config/Jan/data on Linux for the releases before it
    # (https://www.jan.ai/docs/data-folder), and releases before 0.6 used ~/jan/models (janhq/jan
    # docs/docs/guides/quickstart.md).
    if os_name == "linux":
        data = _env_dir(env, "XDG_DATA_HOME", home / ".local" / "share")
        config = _env_dir(env, "XDG_CONFIG_HOME", home / ".config")
        gpt4all, jan_data = data / "nomic.ai" / "GPT4All", [data / "Jan" / "data", config / "Jan" / "data"]
    elif os_name == "macos":
        support = home / "Library" / "Application Support"
        gpt4all, jan_data = support / "nomic.ai" / "GPT4All", [support / "Jan" / "data"]
    else:
        local = Path(env["LOCALAPPDATA"]) if env.get("LOCALAPPDATA") else home / "AppData" / "Local"
        roaming = Path(env["APPDATA"]) if env.get("APPDATA") else home / "AppData" / "Roaming"
        gpt4all, jan_data = local / "nomic.ai" / "GPT4All", [roaming / "Jan" / "data"]
    jan = [folder / sub for folder in jan_data for sub in (Path("llamacpp") / "models", Path("models"))]
    return [LibraryRoot(str(gpt4all), SOURCE_GPT4ALL),
            *(LibraryRoot(str(path), SOURCE_JAN) for path in [*jan, home / "jan" / "models"])]


def _ollama(env: Mapping[str, str], home: Path, os_name: str) -> list[LibraryRoot]:
    # $OLLAMA_MODELS, else ~/.ollama/models (envconfig/config.go, Models()); its FAQ gives
    # ~/.ollama/models on macOS, C:\Users\%username%\.ollama\models on Windows and, for the Linux service the
    # install script creates, /usr/share/ollama/.ollama/models (https://github.com/ollama/ollama/blob/main/docs/faq.mdx,
    # "Where are models stored?"). Blobs are blobs/sha256-<hex> (":" on older non-Windows releases), named by
    # manifests/<host>/<namespace>/<model>/<tag> (server/modelpath.go, GetBlobsPath and GetManifestPath).
    paths = [Path(env["OLLAMA_MODELS"])] if env.get("OLLAMA_MODELS") else []
    paths.append(home / ".ollama" / "models")
    if os_name == "linux":
        paths.append(Path("/usr/share/ollama/.ollama/models"))
    return [LibraryRoot(str(path), SOURCE_OLLAMA, KIND_OLLAMA) for path in paths]


def library_roots(
    user_folders: Iterable[str] = (), env: Mapping[str, str] | None = None, platform: str | None = None,
    bundled: bool = True,
) -> list[LibraryRoot]:
    """Every root to scan: the bundled model (if installed), the apps' folders, then the user's own folders."""
    roots: list[LibraryRoot] = []
    if bundled:
        try:
            roots.append(LibraryRoot(str(default_model_path()), SOURCE_BUNDLED, KIND_FILE))
        except ModelFileError:
            pass
    roots += known_roots(env, platform)
    roots += [LibraryRoot(str(Path(folder).expanduser()), SOURCE_USER) for folder in user_folders if folder]
    return roots
