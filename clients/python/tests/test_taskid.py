"""Guards task_id against faultrouter's Go generator: the vectors are pkg/taskid's Example
output; integration/python_client_test.go compares a larger table with Go's at test time."""

import io

import pytest

from faultrouter import task_id


@pytest.mark.parametrize("content,user,action,authorization,want", [
    (b"contract v3, page 1-12", "alice@example.com", "contract_review", "", "t1-gbfytwymocayisfkuruu2svjbz"),
    (b"refund order 1042: 30.00 EUR", "bob", "refund", "approval-7", "t1-rhgyilbfsftetuosfewamku4e6"),
    (b"refund order 1042: 30.00 EUR", "bob", "refund", "approval-8", "t1-gdalaw3wc4m6xwex7avyee27z6"),
])
def test_go_vectors(content, user, action, authorization, want):
    assert task_id(content, user=user, action=action, authorization=authorization) == want
    # a str is its UTF-8 bytes; a file object is read to its end
    assert task_id(content.decode(), user=user, action=action, authorization=authorization) == want
    assert task_id(io.BytesIO(content), user=user, action=action, authorization=authorization) == want


def test_fields_are_kept_apart():
    # the length prefixes: user "ab" + action "c" is not user "a" + action "bc"
    assert task_id(b"x", user="ab", action="c") != task_id(b"x", user="a", action="bc")


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="user"):
        task_id(b"x", user="", action="refund")
    with pytest.raises(TypeError, match="authorization"):
        task_id(b"x", user="u", action="refund", authorization=None)
