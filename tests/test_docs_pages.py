"""Every code block of the guides (docs/guides/*.md) and the other docs pages (docs/*.md) that
needs TensorFlow runs as written, in order, on small data (tests/test_docs.py holds the
mechanism: the prelude, what each page leaves to the reader, the sizes shrunk for the test, and
the checks of what a page's comments promise).  Listed in tests/heavy.txt: one TensorFlow
process per page, minutes together."""
import pytest

from test_docs import TENSORFLOW_PAGES, _page_id, run_page_blocks


@pytest.mark.parametrize("path", TENSORFLOW_PAGES, ids=_page_id)
def test_page_blocks_run_in_order_on_small_data(path, tmp_path):
  run_page_blocks(path, tmp_path)
