"""TeacherVotes keeps the noiseless counts out of every ordinary output path."""
import copy
import pickle

import numpy as np
import pytest

from tf_dpkit.pate import TeacherVotes

SECRET = np.array([[123457, 1, 0], [1, 123457, 0]])  # distinctive count (not the total)


def test_counts_predictions_and_hides_them():
  votes = TeacherVotes.from_predictions([[0, 0, 2], [1, 1, 1]], num_classes=3)
  assert votes.shape == (2, 3) and votes.num_teachers == 3
  np.testing.assert_array_equal(votes._unsafe_votes(), [[2, 0, 1], [0, 3, 0]])
  np.testing.assert_array_equal(votes._unsafe_votes([1]), [[0, 3, 0]])
  secret = TeacherVotes(SECRET)
  for text in (repr(secret), str(secret), f"{secret}", f"{secret!r}"):
    assert "123457" not in text and "hidden" in text


@pytest.mark.parametrize("leak", [
    pickle.dumps, copy.copy, copy.deepcopy, np.asarray, list, lambda v: v[0]])
def test_votes_cannot_be_pickled_copied_or_converted(leak):
  with pytest.raises(TypeError, match="private"):
    leak(TeacherVotes(SECRET))


def test_the_unsafe_copy_does_not_alias():
  votes = TeacherVotes(SECRET)
  raw = votes._unsafe_votes()
  raw[0, 0] = 0
  assert votes._unsafe_votes()[0, 0] == 123457


@pytest.mark.parametrize("bad, match", [
    (np.zeros((3,)), "2-D"), (np.ones((2, 1)), "num_classes >= 2"),
    (np.array([[1.5, 0.5]]), "integer counts"), (np.array([[-1, 3]]), ">= 0"),
    (np.array([[1, 1], [2, 1]]), "same total"),
])
def test_bad_votes_are_refused(bad, match):
  with pytest.raises(ValueError, match=match):
    TeacherVotes(bad)


def test_bad_predictions_are_refused():
  with pytest.raises(ValueError, match=r"predictions must be classes in \[0, 3\)"):
    TeacherVotes.from_predictions([[0, 3]], num_classes=3)
  with pytest.raises(ValueError, match=r"num_classes must be an integer in \[2, inf\]"):
    TeacherVotes.from_predictions([[0, 0]], num_classes=1)
