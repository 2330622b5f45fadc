"""A ``jupyter_bokeh.BokehModel`` whose view cannot lose its place in the stream of patches.

jupyter_bokeh sends each change to a displayed document as three custom messages (header,
metadata, content; then buffers), which its view feeds to a BokehJS ``Receiver`` one at a time.
A view starts listening when it is constructed, and the front end constructs it in its own time:
on a loaded machine, while the kernel was streaming, a view began in the middle of a message. The
receiver never finds its place again: a view that joined after the header and metadata takes
every later content fragment as a header and every metadata ``{}`` as the content, which it
ignores without a word. The live dashboard then drew no line at all for as long as the run
went on (issue 33: 6,997 steps, an empty plot, a clean browser console).

Here each of the three fragments is the whole message, one JSON object that is a valid header
(``msgid``, ``msgtype``, no buffers), metadata and content (``events``) at once: wherever a view
starts, the next three fragments it reads assemble a real patch. A view still misses what was
sent before it listened; ``refresh()`` hands every view the current document (a full render,
for the end of a run). A patch with binary buffers (numpy columns) goes as jupyter_bokeh sends
it: stream lists, as ``Dashboard`` does.

The model is one way, kernel to page. jupyter_bokeh applies in the kernel what changes on the
page: the view's echo of every patch it applied (each streamed point twice in the kernel's
sources) and the ranges as the page autoscales, pans and zooms (a ``refresh`` then drew the
first seconds of a run, zoomed in). Here only the page's Bokeh events (``MessageSent``: a
button's click) reach the kernel.
"""

from __future__ import annotations

import json

from jupyter_bokeh import BokehModel


class LiveBokehModel(BokehModel):
    """``BokehModel`` for documents that change while a view may be starting (see module)."""

    def _document_patched(self, event) -> None:
        from bokeh.protocol import Protocol

        if event.setter is self:
            return
        message = Protocol().create("PATCH-DOC", [event])
        if message.buffers:
            return super()._document_patched(event)
        whole = json.dumps({**json.loads(message.metadata_json), **json.loads(message.content_json),
                            **json.loads(message.header_json)})
        for _ in range(3):  # header, metadata, content: the same object each time
            self.send({"msg": "patch", "payload": whole})

    def _sync_model(self, model, content, buffers) -> None:
        if content.get("kind") == "MessageSent":
            super()._sync_model(model, content, buffers)

    def refresh(self) -> None:
        """Render every view again from the document as it is now (a full redraw)."""
        self.render_bundle = self._model_to_traits(self._model)
