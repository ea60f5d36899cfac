#!/usr/bin/env bash
# Remove what install-linux.sh installed: the bundle, the menu entry and the icon.
# The chats (~/.local/share/lookahead-chat/chats.sqlite3) and settings (~/.config/lookahead-chat) stay;
# the script prints where they are, so they can be deleted by hand.
set -euo pipefail

NAME="lookahead-chat"
DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
DEST="$DATA/$NAME/app"
APPS="$DATA/applications"

# Only a folder that holds the app's executable is deleted.
if [[ -x "$DEST/$NAME" ]]; then
    rm -rf "$DEST"
    echo "removed $DEST"
elif [[ -e "$DEST" ]]; then
    echo "not removing $DEST: it does not hold $NAME" >&2
fi
rm -rf "$DEST.new"
rm -f "$APPS/$NAME.desktop" "$DATA/icons/hicolor/256x256/apps/$NAME.png"
if command -v update-desktop-database >/dev/null; then
    update-desktop-database -q "$APPS" 2>/dev/null || true
fi
if command -v gtk-update-icon-cache >/dev/null && [[ -f "$DATA/icons/hicolor/index.theme" ]]; then
    gtk-update-icon-cache -q -t "$DATA/icons/hicolor" || true
fi
rmdir "$DATA/$NAME" 2>/dev/null || echo "kept your chats in $DATA/$NAME (and settings in ${XDG_CONFIG_HOME:-$HOME/.config}/$NAME)"
echo "uninstalled the menu entry and icon"
