"""Attachments in the core: sniffing (:mod:`.sniff`), image fitting (:mod:`.images`), what is
refused and how it is said (:mod:`.policy`), the transcription seam (:mod:`.transcribe`), taking
files in before a message is recorded (:mod:`.intake`) and the reply sink that tells people
what was refused (:mod:`.notice`)."""
