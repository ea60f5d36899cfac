#!/usr/bin/env bash
# Install the Lookahead Chat bundle for the current user (no root needed) and add it to the app menu.
#
#   ./install-linux.sh                 from inside the unpacked lookahead-chat/ folder
#   packaging/install-linux.sh [DIR]   from the repo: DIR defaults to dist/lookahead-chat
#
# Puts the bundle in ~/.local/share/lookahead-chat/app (XDG_DATA_HOME is honoured), the menu entry in
# ~/.local/share/applications/lookahead-chat.desktop (Exec and Icon made absolute) and the icon in
# ~/.local/share/icons/hicolor/256x256/apps/. The app keeps its chats in ~/.local/share/lookahead-chat
# itself (platformdirs' user data dir), which is why the bundle goes into app/ below it: installing,
# updating or uninstalling replaces only app/ and never touches the chats.
set -euo pipefail

NAME="lookahead-chat"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -ge 1 ]]; then
    SRC="$(cd "$1" && pwd)"
elif [[ -x "$HERE/$NAME" && -d "$HERE/_internal" ]]; then
    SRC="$HERE"                      # the script ships inside the bundle
else
    SRC="$(cd "$HERE/.." && pwd)/dist/$NAME"
fi
if [[ ! -x "$SRC/$NAME" ]]; then
    echo "no bundle at $SRC (expected the executable $SRC/$NAME); build it with packaging/build-linux.sh" >&2
    exit 1
fi

DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
DEST="$DATA/$NAME/app"
APPS="$DATA/applications"
ICON_DIR="$DATA/icons/hicolor/256x256/apps"
ICON="$ICON_DIR/$NAME.png"
DESKTOP="$APPS/$NAME.desktop"

mkdir -p "$DATA/$NAME" "$APPS" "$ICON_DIR"
# Copy next to the old version first, then swap, so a failed copy leaves the old install working.
rm -rf "$DEST.new"
cp -a "$SRC" "$DEST.new"
rm -rf "$DEST"
mv "$DEST.new" "$DEST"

cp "$DEST/_internal/resources/icons/$NAME-256.png" "$ICON"
# Exec is quoted (the home folder may contain spaces); TryExec hides the entry if the app is gone.
sed -e "s|^Exec=.*|Exec=\"$DEST/$NAME\"|" \
    -e "s|^TryExec=.*||" \
    -e "s|^Icon=.*|Icon=$ICON|" \
    -e "/^Type=/a TryExec=$DEST/$NAME" \
    "$DEST/_internal/resources/$NAME.desktop" >"$DESKTOP.tmp"
sed -i '/^$/d' "$DESKTOP.tmp"
mv "$DESKTOP.tmp" "$DESKTOP"
chmod 644 "$DESKTOP"

if command -v desktop-file-validate >/dev/null; then
    desktop-file-validate --no-hints "$DESKTOP" || echo "warning: desktop-file-validate reported problems in $DESKTOP" >&2
fi
if command -v update-desktop-database >/dev/null; then
    update-desktop-database -q "$APPS" || true
fi
if command -v gtk-update-icon-cache >/dev/null && [[ -f "$DATA/icons/hicolor/index.theme" ]]; then
    gtk-update-icon-cache -q -t "$DATA/icons/hicolor" || true
fi

echo "installed: $DEST/$NAME"
echo "menu entry: $DESKTOP"
echo "chats are stored in: $DATA/$NAME"
