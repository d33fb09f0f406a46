"""Systems under test, one sub-package per family: ttc/ (LBS), tts/ (FastTTS), serving/ (BEAM)."""
